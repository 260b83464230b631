//! The worker's stop as one value every loop listens to: started once,
//! by whoever holds the [`Trigger`] (the caller's signal), and heard by the
//! lease loop and every host pipeline through their [`Shutdown`] clones.

use tokio::sync::watch;

/// Starts the stop.
#[derive(Debug)]
pub(crate) struct Trigger(watch::Sender<bool>);

/// Hears the stop.
#[derive(Debug, Clone)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

/// A stop not started yet, and what starts it.
pub(crate) fn channel() -> (Trigger, Shutdown) {
    let (sender, receiver) = watch::channel(false);
    (Trigger(sender), Shutdown(receiver))
}

impl Trigger {
    /// Starts the stop; every listener hears it, now or when it next asks.
    pub(crate) fn start(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// Waits until the stop starts (at once if it has). A dropped trigger
    /// never starts it: the wait then lasts for ever, as no stop will come.
    pub(crate) async fn started(&mut self) {
        if self.0.wait_for(|stop| *stop).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_hears_the_stop_once_started() {
        let (trigger, shutdown) = channel();
        let mut early = shutdown.clone();
        let waiting = tokio::spawn(async move { early.started().await });
        trigger.start();
        waiting.await.unwrap();
        let mut late = shutdown.clone();
        late.started().await;
    }
}
