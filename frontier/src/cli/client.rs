//! What every client subcommand shares: the frontier's address, the crawl,
//! the token, and the connections they make.

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
}

pub type Intercepted = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

impl ClientArgs {
    pub async fn channel(&self) -> anyhow::Result<(Channel, Bearer)> {
        let bearer = Bearer::new(self.token.as_deref()).context("--token")?;
        Ok((connect(&self.addr).await?, bearer))
    }

    pub async fn admin(&self) -> anyhow::Result<AdminClient<Intercepted>> {
        let (channel, bearer) = self.channel().await?;
        Ok(AdminClient::with_interceptor(channel, bearer))
    }

    pub async fn frontier(&self) -> anyhow::Result<UrlFrontierClient<Intercepted>> {
        let (channel, bearer) = self.channel().await?;
        Ok(UrlFrontierClient::with_interceptor(channel, bearer))
    }
}

pub async fn connect(address: &str) -> anyhow::Result<Channel> {
    Channel::from_shared(address.to_owned())
        .with_context(|| format!("{address:?} is not a valid frontier address"))?
        .connect()
        .await
        .with_context(|| format!("cannot reach the frontier at {address}"))
}
