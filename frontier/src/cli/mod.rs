//! The `frontier` binary's subcommands that are more than a call or two:
//! moving a crawl's URLs in and out, and the store repair tools.

pub mod repair;
pub mod transfer;
