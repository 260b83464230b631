//! `frontier export` and `frontier import`: a crawl's URLs as JSON lines,
//! one URL item per line in the proto3 JSON form of the API's URLItem,
//! after a line with the crawl's revisit policy when it has one of its own
//! (`{"revisit": {...}}`): a crawl moved without it would be served under
//! the target's default policy (unless the target was started with one,
//! never to come back). Import sets it after the items.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::ClientArgs;

/// The proto3 JSON form of a URL item (uint64 as strings, lowerCamel names
/// as the API's JSON mapping gives them).
fn item_json(item: &proto::urlfrontier::UrlItem) -> serde_json::Value {
    use proto::urlfrontier::url_item::Item;
    let info_json = |info: &proto::urlfrontier::UrlInfo| {
        let metadata: serde_json::Map<String, serde_json::Value> = info
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!({ "values": v.values })))
            .collect();
        serde_json::json!({
            "url": info.url,
            "key": info.key,
            "metadata": metadata,
            "crawlID": info.crawl_id,
        })
    };
    let mut value = serde_json::json!({
        "ID": item.id,
        "creationDate": item.creation_date.to_string(),
    });
    match &item.item {
        Some(Item::Known(known)) => {
            value["known"] = serde_json::json!({
                "info": known.info.as_ref().map(info_json),
                "refetchableFromDate": known.refetchable_from_date.to_string(),
            });
        }
        Some(Item::Discovered(discovered)) => {
            value["discovered"] =
                serde_json::json!({ "info": discovered.info.as_ref().map(info_json) });
        }
        None => {}
    }
    value
}

/// A crawl's own revisit policy, as an export's first line.
fn revisit_json(crawl: &str, policy: &proto::admin::RevisitPolicy) -> serde_json::Value {
    serde_json::json!({
        "revisit": {
            "crawlID": crawl,
            "policy": policy.policy,
            "minSecs": policy.min_secs,
            "maxSecs": policy.max_secs,
        }
    })
}

/// One line of an export.
#[derive(Debug)]
enum Line {
    Item(proto::urlfrontier::UrlItem),
    /// A crawl's revisit policy, checked as `frontier revisit` checks it.
    Revisit(proto::admin::SetRevisitRequest),
}

/// Reads one exported line back; a clear message when the line is neither
/// a URL item nor a revisit policy.
fn line_of_json(line: &str) -> Result<Line, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let revisit = &value["revisit"];
    if !revisit.is_object() {
        return item_of_json(&value).map(Line::Item);
    }
    let secs = |name: &str| -> Result<u64, String> {
        match &revisit[name] {
            serde_json::Value::Null => Ok(0),
            serde_json::Value::Number(n) => n
                .as_u64()
                .ok_or_else(|| format!("revisit {name} {n} is not a whole number of seconds")),
            other => Err(format!("revisit {name} must be a number, not {other}")),
        }
    };
    let (min_secs, max_secs) = (secs("minSecs")?, secs("maxSecs")?);
    let Some(policy) = revisit["policy"].as_str() else {
        return Err("a revisit line without its policy".into());
    };
    frontier::revisit::Policy::parse(policy, min_secs, max_secs)
        .map_err(|error| format!("revisit policy {policy:?}: {error}"))?;
    let crawl_id = match &revisit["crawlID"] {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(crawl) => crawl.clone(),
        other => return Err(format!("revisit crawlID must be a string, not {other}")),
    };
    Ok(Line::Revisit(proto::admin::SetRevisitRequest {
        crawl_id,
        policy: policy.to_owned(),
        min_secs,
        max_secs,
        local: false,
    }))
}

/// Reads one exported URL item back; a clear message when it is not one.
fn item_of_json(value: &serde_json::Value) -> Result<proto::urlfrontier::UrlItem, String> {
    use proto::urlfrontier as uf;
    let number = |v: &serde_json::Value| -> Result<u64, String> {
        match v {
            serde_json::Value::Null => Ok(0),
            serde_json::Value::Number(n) => {
                n.as_u64().ok_or_else(|| format!("{n} is not a uint64"))
            }
            serde_json::Value::String(s) => s.parse().map_err(|_| format!("{s:?} is not a uint64")),
            other => Err(format!("{other} is not a uint64")),
        }
    };
    let text = |v: &serde_json::Value, name: &str| -> Result<String, String> {
        match v {
            serde_json::Value::Null => Ok(String::new()),
            serde_json::Value::String(s) => Ok(s.clone()),
            other => Err(format!("{name} must be a string, not {other}")),
        }
    };
    let info_of = |v: &serde_json::Value| -> Result<uf::UrlInfo, String> {
        let url = text(&v["url"], "url")?;
        if url.is_empty() {
            return Err("an item without a url".into());
        }
        let mut metadata = std::collections::BTreeMap::new();
        if let Some(map) = v["metadata"].as_object() {
            for (key, list) in map {
                let values = list["values"]
                    .as_array()
                    .ok_or_else(|| format!("metadata {key:?} has no values list"))?
                    .iter()
                    .map(|value| text(value, "a metadata value"))
                    .collect::<Result<Vec<_>, _>>()?;
                metadata.insert(key.clone(), uf::StringList { values });
            }
        }
        Ok(uf::UrlInfo {
            url,
            key: text(&v["key"], "key")?,
            metadata,
            crawl_id: text(&v["crawlID"], "crawlID")?,
        })
    };
    let item = if value["known"].is_object() {
        uf::url_item::Item::Known(uf::KnownUrlItem {
            info: Some(info_of(&value["known"]["info"])?),
            refetchable_from_date: number(&value["known"]["refetchableFromDate"])?,
        })
    } else if value["discovered"].is_object() {
        uf::url_item::Item::Discovered(uf::DiscoveredUrlItem {
            info: Some(info_of(&value["discovered"]["info"])?),
        })
    } else {
        return Err("neither a known nor a discovered item".into());
    };
    Ok(uf::UrlItem {
        item: Some(item),
        id: text(&value["ID"], "ID")?,
        creation_date: number(&value["creationDate"])?,
    })
}

/// The crawl's revisit policy when it has one of its own; `None` when it
/// follows the frontier's default, or when the frontier would not say
/// (the export goes on without it, and says so).
async fn own_revisit(client: &ClientArgs) -> Option<proto::admin::RevisitPolicy> {
    let asked = async {
        let mut admin = client.admin()?;
        let request = proto::admin::GetProgressRequest {
            crawl_id: client.crawl.clone(),
            local: false,
        };
        anyhow::Ok(admin.get_progress(request).await?.into_inner())
    };
    match asked.await {
        Ok(progress) => progress.revisit.filter(|policy| policy.own),
        Err(error) => {
            eprintln!("export: the crawl's revisit policy is not exported: {error:#}");
            None
        }
    }
}

pub async fn export(client: ClientArgs, output: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let revisit = own_revisit(&client).await;
    let frontier = client.frontier()?;
    let request = proto::urlfrontier::ListUrlParams {
        start: 0,
        size: u32::MAX,
        crawl_id: client.crawl.clone(),
        ..Default::default()
    };
    // Only the call's start is tried again: lines written already would be
    // written twice by a stream started over.
    let mut stream = client
        .retry("export", || {
            let mut frontier = frontier.clone();
            let request = request.clone();
            async move { frontier.list_ur_ls(request).await }
        })
        .await?;
    let mut out: Box<dyn Write> = match &output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    if let Some(policy) = &revisit {
        serde_json::to_writer(&mut out, &revisit_json(&client.crawl, policy))?;
        out.write_all(b"\n")?;
    }
    let mut count = 0_u64;
    while let Some(item) = stream.message().await? {
        serde_json::to_writer(&mut out, &item_json(&item))?;
        out.write_all(b"\n")?;
        count += 1;
    }
    out.flush()?;
    drop(out);
    match &revisit {
        Some(policy) => eprintln!(
            "exported {count} URLs, and the crawl's revisit policy ({})",
            super::revisit::describe(Some(policy))
        ),
        None => eprintln!("exported {count} URLs"),
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn import(
    client: ClientArgs,
    into_crawl: bool,
    file: PathBuf,
) -> anyhow::Result<ExitCode> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?
    };
    // Everything is checked first: a bad line stops the import before
    // anything is sent.
    let mut items = Vec::new();
    let mut revisits = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line = line_of_json(line)
            .map_err(|reason| anyhow::anyhow!("line {}: {reason}", number + 1))?;
        let mut item = match line {
            Line::Item(item) => item,
            Line::Revisit(mut revisit) => {
                if into_crawl {
                    revisit.crawl_id = client.crawl.clone();
                }
                revisits.push(revisit);
                continue;
            }
        };
        if into_crawl {
            use proto::urlfrontier::url_item::Item;
            let info = match &mut item.item {
                Some(Item::Known(known)) => known.info.as_mut(),
                Some(Item::Discovered(discovered)) => discovered.info.as_mut(),
                None => None,
            };
            if let Some(info) = info {
                info.crawl_id = client.crawl.clone();
            }
        }
        items.push(item);
    }
    let frontier = client.frontier()?;
    let total = items.len();
    // Items acked FAIL may be sent again (the API's word for it), and a
    // known item overwrites: they go again, with the call itself, until
    // none fails or --retry-secs have passed.
    let started = std::time::Instant::now();
    let (mut ok, mut skipped) = (0, 0);
    let mut pending = items;
    loop {
        let sending = pending.clone();
        let mut acks = client
            .retry("import", || {
                let mut frontier = frontier.clone();
                let sending = sending.clone();
                async move { frontier.put_ur_ls(futures::stream::iter(sending)).await }
            })
            .await?;
        // An ack names its item by ID (the URL when the item has none).
        let mut unanswered: HashMap<String, VecDeque<usize>> = HashMap::new();
        for (index, item) in sending.iter().enumerate() {
            unanswered
                .entry(item.ack_id())
                .or_default()
                .push_back(index);
        }
        let mut again = Vec::new();
        while let Some(ack) = acks.message().await? {
            let Some(index) = unanswered.get_mut(&ack.id).and_then(VecDeque::pop_front) else {
                continue;
            };
            match ack.status() {
                proto::urlfrontier::ack_message::Status::Ok => ok += 1,
                proto::urlfrontier::ack_message::Status::Skipped => skipped += 1,
                proto::urlfrontier::ack_message::Status::Fail => again.push(index),
            }
        }
        // Items the stream ended without answering go again too.
        again.extend(unanswered.into_values().flatten());
        again.sort_unstable();
        pending = again
            .into_iter()
            .map(|index| sending[index].clone())
            .collect();
        if pending.is_empty()
            || started.elapsed() >= std::time::Duration::from_secs(client.retry_secs)
        {
            break;
        }
        eprintln!("import: {} URLs failed; sending them again", pending.len());
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let failed = pending.len();
    // The policy last: set first, it would settle the items' reports, and
    // a URL completed on the source (under its policy then) would be due
    // again here. After them, each URL keeps the state it was exported in.
    for request in revisits {
        super::revisit::send(&client, request).await?;
    }
    println!("imported {ok} of {total} URLs, skipped {skipped}, failed {failed}");
    Ok(if failed == 0 && ok + skipped == total {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}
