//! What every client subcommand shares: the frontier's address, the crawl,
//! the token, the connections they make, and how they ride out a frontier
//! that cannot answer yet.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context;
use proto::admin::admin_client::AdminClient;
use proto::bearer::Bearer;
use proto::urlfrontier::url_frontier_client::UrlFrontierClient;
use tonic::transport::Channel;

#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The frontier's address.
    #[arg(
        long,
        global = true,
        env = "FRONTIER_ADDR",
        default_value = "http://127.0.0.1:7071"
    )]
    pub addr: String,
    /// The crawl (empty: DEFAULT).
    #[arg(long, global = true, env = "FRONTIER_CRAWL", default_value = "")]
    pub crawl: String,
    /// The admin token, for calls that change the frontier.
    #[arg(long, global = true, env = "FRONTIER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA certificate the frontier's certificate is checked against,
    /// for an `https://` --addr (default: the public web's roots).
    #[arg(long, global = true, env = "FRONTIER_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM certificate shown to a frontier that asks for one (mutual
    /// TLS); with --tls-key.
    #[arg(long, global = true, env = "FRONTIER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, env = "FRONTIER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// How long a call is tried again while the frontier answers
    /// UNAVAILABLE or cannot be reached (a cluster forming, partitions
    /// moving, a node restarting); 0: once.
    #[arg(long, global = true, env = "FRONTIER_RETRY_SECS", default_value_t = 60)]
    pub retry_secs: u64,
}

/// The first pause between two tries; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// While the reason stays the same, a waiting line at most this often.
const SAY_EVERY: Duration = Duration::from_secs(5);

pub type Intercepted = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

impl ClientArgs {
    /// A channel that connects at its first call, so that a frontier not
    /// listening yet is an UNAVAILABLE answer that [`Self::retry`] rides
    /// out.
    pub fn channel(&self) -> anyhow::Result<(Channel, Bearer)> {
        let bearer = Bearer::new(self.token.as_deref()).context("--token")?;
        let tls = proto::tls::ClientTls::from_files(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )?;
        Ok((tls.endpoint(&self.addr, false)?.connect_lazy(), bearer))
    }

    /// Calls `call` until it answers anything but UNAVAILABLE, or until
    /// `--retry-secs` have passed, pausing longer each time; says on
    /// stderr what it waits for.
    pub async fn retry<T, F, Fut>(&self, what: &str, mut call: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let limit = Duration::from_secs(self.retry_secs);
        let mut pause = FIRST_PAUSE;
        let mut said: Option<(String, Instant)> = None;
        loop {
            let status = match call().await {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(status) if status.code() == tonic::Code::Unavailable => status,
                Err(status) => return Err(anyhow::Error::from(status).context(what.to_owned())),
            };
            if started.elapsed() + pause > limit {
                return Err(anyhow::Error::from(status).context(format!(
                    "{what}: the frontier at {} was unavailable for {} s (--retry-secs {})",
                    self.addr,
                    started.elapsed().as_secs(),
                    self.retry_secs
                )));
            }
            let reason = waiting_reason(&status);
            let repeat = said
                .as_ref()
                .is_some_and(|(last, at)| *last == reason || at.elapsed() < SAY_EVERY);
            if !repeat {
                eprintln!(
                    "{what}: waiting for the frontier at {} ({} s of {} s): {reason}",
                    self.addr,
                    started.elapsed().as_secs(),
                    self.retry_secs
                );
                said = Some((reason, Instant::now()));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    pub fn admin(&self) -> anyhow::Result<AdminClient<Intercepted>> {
        let (channel, bearer) = self.channel()?;
        Ok(AdminClient::with_interceptor(channel, bearer))
    }

    pub fn frontier(&self) -> anyhow::Result<UrlFrontierClient<Intercepted>> {
        let (channel, bearer) = self.channel()?;
        Ok(UrlFrontierClient::with_interceptor(channel, bearer))
    }
}

/// What an UNAVAILABLE answer says, in one line: the transport's own
/// words (a refused connection) when the status carries no message of
/// the frontier's.
pub fn waiting_reason(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut reason = status.message().to_owned();
    let mut source = status.source();
    while let Some(error) = source {
        reason = format!("{reason}: {error}");
        source = error.source();
    }
    if reason.is_empty() {
        "unavailable".to_owned()
    } else {
        reason
    }
}
