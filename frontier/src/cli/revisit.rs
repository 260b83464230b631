//! A crawl's revisit policy, set live (`frontier revisit`), and how a
//! URL's revisit history reads (`frontier check`).

use std::process::ExitCode;

use proto::metadata::{self, RevisitState};

use super::client::ClientArgs;
use frontier::revisit::{History, Metadata, Policy};

pub async fn set_revisit(
    client: ClientArgs,
    policy: String,
    min_secs: Option<u64>,
    max_secs: Option<u64>,
) -> anyhow::Result<ExitCode> {
    let policy = if policy == "default" {
        String::new()
    } else {
        // Checked here too, so that a mistake reads as the flags' names.
        let (min, max) = (min_secs.unwrap_or(0), max_secs.unwrap_or(0));
        let max = if policy == "fixed" { max.max(min) } else { max };
        Policy::parse(&policy, min, max).map_err(|error| match (policy.as_str(), error) {
            ("fixed", _) if min_secs.is_none() => {
                anyhow::anyhow!("--policy fixed needs --min-secs (its interval)")
            }
            ("adaptive", _) if min_secs.is_none() || max_secs.is_none() => {
                anyhow::anyhow!("--policy adaptive needs --min-secs and --max-secs")
            }
            (_, error) => anyhow::anyhow!("{error}"),
        })?;
        policy
    };
    let request = proto::admin::SetRevisitRequest {
        crawl_id: client.crawl.clone(),
        policy,
        min_secs: min_secs.unwrap_or(0),
        max_secs: max_secs.unwrap_or(0),
        local: false,
    };
    send(&client, request).await?;
    Ok(ExitCode::SUCCESS)
}

/// Sets a crawl's policy (retried as any call) and says what it is now.
pub async fn send(
    client: &ClientArgs,
    request: proto::admin::SetRevisitRequest,
) -> anyhow::Result<()> {
    let admin = client.admin()?;
    let answer = client
        .retry("revisit", || {
            let mut admin = admin.clone();
            let request = request.clone();
            async move { admin.set_revisit(request).await }
        })
        .await?;
    println!(
        "crawl {}: revisit {}",
        frontier::service::crawl_or_default(&request.crawl_id),
        describe(Some(&answer))
    );
    Ok(())
}

/// A policy as the admin API gives it, in words.
pub fn describe(policy: Option<&proto::admin::RevisitPolicy>) -> String {
    let Some(policy) = policy else {
        return "never".to_owned();
    };
    let named = Policy::parse(
        &policy.policy,
        u64::from(policy.min_secs),
        u64::from(policy.max_secs),
    )
    .map_or_else(|_| policy.policy.clone(), |p| p.to_string());
    if policy.own {
        named
    } else {
        format!("{named} (the frontier's default)")
    }
}

/// The lines `frontier check` prints of a URL's revisits: its fetches,
/// the changes seen, the interval and when it is due again, and why.
pub fn history_lines(metadata: &Metadata, due_at: u64, completed: bool) -> Vec<String> {
    let Some(text) = metadata.get(metadata::REVISIT).and_then(|v| v.first()) else {
        return Vec::new();
    };
    let Some(state) = RevisitState::parse(text) else {
        return vec![format!("revisits   unreadable state {text:?}")];
    };
    let history = History::of_state(&state);
    let mut lines = vec![format!(
        "revisits   fetched {} time(s) since counting, changed {}, last fetched {}",
        history.fetches + 1,
        history.changes,
        history.last_fetched
    )];
    let why = if completed {
        "done: its last report left no revisit".to_owned()
    } else if due_at == history.last_fetched + u64::from(history.interval_secs) {
        match history.change_rate() {
            Some(rate) if rate > 0.0 => format!(
                "interval {} s; estimated change every {:.0} s",
                history.interval_secs,
                1.0 / rate
            ),
            Some(_) => format!("interval {} s; no change seen", history.interval_secs),
            None => format!("interval {} s; first fetch", history.interval_secs),
        }
    } else {
        "the date its crawler gave (a retry, or its own schedule)".to_owned()
    };
    lines.push(format!("next due   {due_at} ({why})"));
    let captured = state.captured.map(|at| at.to_string());
    for (label, value) in [
        ("etag", &state.etag),
        ("modified", &state.last_modified),
        ("digest", &state.digest),
        ("captured", &captured),
    ] {
        if let Some(value) = value {
            lines.push(format!("{label:<10} {value}"));
        }
    }
    lines
}
