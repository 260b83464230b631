//! A value shared by many tasks that goes back to its owner when the last
//! of them lets go of it, so that a clean shutdown waits for exactly that
//! moment instead of polling a reference count.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

/// The shared value. Share it as `Arc<Handback<T>>`; dropping the last
/// `Arc` sends the value to the [`Returned`] of [`Handback::share`].
#[derive(Debug)]
pub struct Handback<T> {
    /// Present until the drop that hands it back.
    value: Option<T>,
    owner: Option<oneshot::Sender<T>>,
}

/// Where a [`Handback`]'s value arrives once no task holds it.
#[derive(Debug)]
pub struct Returned<T>(oneshot::Receiver<T>);

impl<T> Handback<T> {
    /// Shares `value`; the owner gets it back through the [`Returned`].
    pub fn share(value: T) -> (Arc<Self>, Returned<T>) {
        let (owner, returned) = oneshot::channel();
        let shared = Arc::new(Self {
            value: Some(value),
            owner: Some(owner),
        });
        (shared, Returned(returned))
    }
}

impl<T> Deref for Handback<T> {
    type Target = T;

    fn deref(&self) -> &T {
        match &self.value {
            Some(value) => value,
            // Only `drop` takes the value, and nothing derefs after that.
            None => unreachable!("a Handback's value is taken only when it is dropped"),
        }
    }
}

impl<T> Drop for Handback<T> {
    fn drop(&mut self) {
        if let (Some(value), Some(owner)) = (self.value.take(), self.owner.take()) {
            // A `Returned` that gave up waiting lets the value drop here.
            let _ = owner.send(value);
        }
    }
}

impl<T> Returned<T> {
    /// The value, once the last holder has dropped it; `None` if holders
    /// remain after `limit` (the value then drops with the last of them).
    pub async fn within(self, limit: Duration) -> Option<T> {
        tokio::time::timeout(limit, self.0).await.ok()?.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_value_comes_back_when_the_last_holder_drops_it() {
        let (shared, returned) = Handback::share(String::from("frontier"));
        let holder = Arc::clone(&shared);
        drop(shared);
        let task = tokio::spawn(async move {
            // Still usable through any holder.
            assert_eq!(holder.len(), 8);
        });
        task.await.unwrap();
        assert_eq!(
            returned.within(Duration::from_secs(60)).await.as_deref(),
            Some("frontier")
        );
    }

    #[tokio::test]
    async fn a_holder_that_stays_makes_the_wait_give_up() {
        let (shared, returned) = Handback::share(7_u32);
        let kept = Arc::clone(&shared);
        drop(shared);
        assert_eq!(returned.within(Duration::from_millis(1)).await, None);
        assert_eq!(**kept, 7);
    }
}
