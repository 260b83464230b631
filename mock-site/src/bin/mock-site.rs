//! `mock-site`: serves the deterministic test site (see the `mock_site`
//! library) until killed.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mock_site::{MockSite, SiteConfig, expected_fetches};

#[derive(Debug, Parser)]
#[command(
    name = "mock-site",
    about = "A deterministic web site for crawl tests and demos"
)]
struct Args {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, env = "MOCK_SITE_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Regular pages.
    #[arg(long, env = "MOCK_SITE_PAGES", default_value_t = 30)]
    pages: usize,
    /// Milliseconds added to every answer.
    #[arg(long, env = "MOCK_SITE_LATENCY_MS", default_value_t = 0)]
    latency_ms: u64,
    /// robots.txt Crawl-delay, seconds (a fraction allowed, e.g. 0.25).
    #[arg(long, env = "MOCK_SITE_CRAWL_DELAY")]
    crawl_delay: Option<f64>,
    /// The base URL clients reach the site by (default: http://LISTEN);
    /// absolute links use it.
    #[arg(long, env = "MOCK_SITE_BASE_URL")]
    base_url: Option<String>,
    /// Print `HIT <status> <path>` for every request.
    #[arg(long, env = "MOCK_SITE_LOG_HITS")]
    log_hits: bool,
    /// Print the paths a crawl with this depth limit fetches, and exit.
    #[arg(long)]
    print_expected: Option<u32>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = SiteConfig {
        pages: args.pages,
        crawl_delay: args
            .crawl_delay
            .map(|secs| Duration::try_from_secs_f64(secs).context("--crawl-delay"))
            .transpose()?,
        slow: Duration::from_millis(800),
        latency: Duration::from_millis(args.latency_ms),
    };
    if let Some(depth) = args.print_expected {
        for (path, times) in expected_fetches(&config, depth) {
            println!("{times} {path}");
        }
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // Port 0 binds a free port: links must name the bound one.
    let base = args.base_url.unwrap_or_else(|| {
        format!(
            "http://{}",
            listener.local_addr().map_or(args.listen, |a| a)
        )
    });
    let site = MockSite::serve_as(listener, config, &base, args.log_hits)?;
    println!("listening on {} as {}", site.addr, site.base());
    // Containers stop with SIGTERM, terminals with Ctrl-C.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}
