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
}

pub type Intercepted = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

impl ClientArgs {
    pub async fn channel(&self) -> anyhow::Result<(Channel, Bearer)> {
        let bearer = Bearer::new(self.token.as_deref()).context("--token")?;
        let tls = proto::tls::ClientTls::from_files(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )?;
        Ok((connect(&self.addr, &tls).await?, bearer))
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

pub async fn connect(address: &str, tls: &proto::tls::ClientTls) -> anyhow::Result<Channel> {
    tls.endpoint(address, false)?
        .connect()
        .await
        .with_context(|| format!("cannot reach the frontier at {address}"))
}
