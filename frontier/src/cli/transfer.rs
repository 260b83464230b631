//! `frontier export` and `frontier import`: a crawl's URLs as JSON lines,
//! one URL item per line in the proto3 JSON form of the API's URLItem.

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

/// Reads one exported line back into a URL item; a clear message when the
/// line is not one.
fn item_of_json(line: &str) -> Result<proto::urlfrontier::UrlItem, String> {
    use proto::urlfrontier as uf;
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
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
        let mut metadata = std::collections::HashMap::new();
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

pub async fn export(client: ClientArgs, output: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut frontier = client.frontier().await?;
    let mut stream = frontier
        .list_ur_ls(proto::urlfrontier::ListUrlParams {
            start: 0,
            size: u32::MAX,
            crawl_id: client.crawl.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out: Box<dyn Write> = match &output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut count = 0_u64;
    while let Some(item) = stream.message().await? {
        serde_json::to_writer(&mut out, &item_json(&item))?;
        out.write_all(b"\n")?;
        count += 1;
    }
    out.flush()?;
    drop(out);
    eprintln!("exported {count} URLs");
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
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut item = item_of_json(line)
            .map_err(|reason| anyhow::anyhow!("line {}: {reason}", number + 1))?;
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
    let mut frontier = client.frontier().await?;
    let total = items.len();
    let mut acks = frontier
        .put_ur_ls(futures::stream::iter(items))
        .await?
        .into_inner();
    let (mut ok, mut skipped, mut failed) = (0, 0, 0);
    while let Some(ack) = acks.message().await? {
        match ack.status() {
            proto::urlfrontier::ack_message::Status::Ok => ok += 1,
            proto::urlfrontier::ack_message::Status::Skipped => skipped += 1,
            proto::urlfrontier::ack_message::Status::Fail => failed += 1,
        }
    }
    println!("imported {ok} of {total} URLs, skipped {skipped}, failed {failed}");
    Ok(if failed == 0 && ok + skipped == total {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}
