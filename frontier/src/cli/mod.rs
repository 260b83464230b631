//! The `frontier` binary's subcommands; `main.rs` parses the command line
//! and dispatches here.
//!
//! - [`serve`]: the service itself, from its options to a clean shutdown.
//! - [`client`]: what the client subcommands share (address, crawl, token).
//! - [`admin`]: the operator's calls to a running frontier.
//! - [`output`]: how their answers are printed, as text or JSON.
//! - [`revisit`]: a crawl's revisit policy, and a URL's revisit history.
//! - [`transfer`]: moving a crawl's URLs in and out (export, import).
//! - [`repair`]: the store repair tools, which need no running frontier.

pub mod admin;
pub mod client;
pub mod output;
pub mod repair;
pub mod revisit;
pub mod serve;
pub mod transfer;

pub use client::ClientArgs;
