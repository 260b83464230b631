//! What a worker writes: WARC 1.1 files (a request and a response record
//! per fetch, each record its own gzip member so tools can index and seek
//! them, rotated at a size) and a crawl log of one JSON line per fetch.
//! File names carry the worker's ID, so workers can share a directory.
//!
//! Bodies are recorded as the worker saw them: decoded. The recorded
//! response headers therefore drop Content-Encoding and Transfer-Encoding
//! and give the decoded Content-Length, so the record is a valid HTTP
//! message for its body.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use sha1::{Digest, Sha1};
use warc::{RawRecordHeader, WarcHeader};

use crate::fetch::Fetched;

/// `sha1:` + base32, the digest form WARC tools expect.
#[must_use]
pub fn digest(bytes: &[u8]) -> String {
    format!(
        "sha1:{}",
        data_encoding::BASE32.encode(&Sha1::digest(bytes))
    )
}

/// [`digest`] of `parts` one after the other, without joining them.
fn digest_of_parts(parts: &[&[u8]]) -> String {
    let mut sha1 = Sha1::new();
    for part in parts {
        sha1.update(part);
    }
    format!("sha1:{}", data_encoding::BASE32.encode(&sha1.finalize()))
}

fn warc_date() -> String {
    iso_date(proto::time::Timestamp::now().unix_secs())
}

/// A UTC epoch second as `YYYY-MM-DDTHH:MM:SSZ` (WARC-Date), without a
/// date crate.
fn iso_date(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

struct WarcFile {
    dir: PathBuf,
    worker_id: String,
    max_bytes: u64,
    current: Option<(File, PathBuf)>,
    written: u64,
    serial: u32,
    /// Syncs of rotated files, run off the writer's thread (a writer may be
    /// an async task) and joined by [`Output::flush`].
    syncing: Vec<std::thread::JoinHandle<io::Result<()>>>,
}

/// The outcome of a rotated file's sync.
fn joined(sync: std::thread::JoinHandle<io::Result<()>>) -> io::Result<()> {
    sync.join()
        .map_err(|_| io::Error::other("a WARC file's sync panicked"))?
}

thread_local! {
    // One compressor per thread for every record it writes: making one
    // zeroes a few hundred kilobytes of tables, more work than compressing
    // a small page. Per thread, so records are compressed outside the
    // file's lock.
    static DEFLATE: std::cell::RefCell<flate2::Compress> =
        std::cell::RefCell::new(flate2::Compress::new(flate2::Compression::fast(), false));
}

/// A WARC record as one gzip member, ready to append.
fn record_member(header: RawRecordHeader, body: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    append_record_member(&mut out, header, &[body])?;
    Ok(out)
}

/// Appends to `out` a WARC record whose block is `parts` one after the
/// other, as one gzip member. The record is compressed as it is laid out:
/// its block is never copied whole (a page's body would otherwise be held
/// several times over while its record is made: once as the HTTP message,
/// once as the record, once compressed), so what a page costs beyond its
/// body is its compressed record alone.
fn append_record_member(
    out: &mut Vec<u8>,
    mut header: RawRecordHeader,
    parts: &[&[u8]],
) -> io::Result<()> {
    let length: usize = parts.iter().map(|part| part.len()).sum();
    header
        .headers
        .insert(WarcHeader::ContentLength, length.to_string().into_bytes());
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(b"WARC/");
    head.extend_from_slice(header.version.as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in header.as_ref() {
        head.extend_from_slice(name.to_string().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    DEFLATE.with(|deflate| {
        let mut deflate = deflate.borrow_mut();
        let mut member = GzipMember::start(&mut deflate, out, length / 4);
        member.feed(&head)?;
        for part in parts {
            member.feed(part)?;
        }
        member.feed(b"\r\n\r\n")?;
        member.finish()
    })
}

/// One gzip member (RFC 1952) being appended to a buffer, compressed as
/// its data is fed.
struct GzipMember<'a> {
    deflate: &'a mut flate2::Compress,
    out: &'a mut Vec<u8>,
    crc: flate2::Crc,
}

impl<'a> GzipMember<'a> {
    fn start(deflate: &'a mut flate2::Compress, out: &'a mut Vec<u8>, expected: usize) -> Self {
        deflate.reset();
        out.reserve(expected + 64);
        // Magic, deflate, no flags, no time, fastest level, unknown OS.
        out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255]);
        Self {
            deflate,
            out,
            crc: flate2::Crc::new(),
        }
    }

    /// Compresses `data` into the member, growing the buffer as needed.
    fn feed(&mut self, data: &[u8]) -> io::Result<()> {
        self.crc.update(data);
        let start = self.deflate.total_in();
        loop {
            let done =
                usize::try_from(self.deflate.total_in() - start).map_err(io::Error::other)?;
            if done == data.len() {
                return Ok(());
            }
            spare_room(self.out);
            self.deflate
                .compress_vec(&data[done..], self.out, flate2::FlushCompress::None)
                .map_err(io::Error::other)?;
        }
    }

    /// Ends the deflate stream and writes the trailer.
    fn finish(self) -> io::Result<()> {
        loop {
            spare_room(self.out);
            let status = self
                .deflate
                .compress_vec(&[], self.out, flate2::FlushCompress::Finish)
                .map_err(io::Error::other)?;
            if status == flate2::Status::StreamEnd {
                break;
            }
        }
        self.out.extend_from_slice(&self.crc.sum().to_le_bytes());
        // ISIZE: the length modulo 2^32, as RFC 1952 has it.
        self.out.extend_from_slice(&self.crc.amount().to_le_bytes());
        Ok(())
    }
}

/// Spare capacity for the compressor to write into (it fills what is
/// there and never grows the buffer), doubling what the member took.
fn spare_room(out: &mut Vec<u8>) {
    if out.capacity() - out.len() < 64 {
        out.reserve(out.len().max(4096));
    }
}

impl WarcFile {
    fn writer(&mut self) -> io::Result<&mut File> {
        if self.current.is_some() && self.written < self.max_bytes {
            return self
                .current
                .as_mut()
                .map(|(file, _)| file)
                .ok_or_else(|| io::Error::other("no file"));
        }
        if let Some((file, _)) = self.current.take() {
            let (done, running) = std::mem::take(&mut self.syncing)
                .into_iter()
                .partition::<Vec<_>, _>(std::thread::JoinHandle::is_finished);
            self.syncing = running;
            for sync in done {
                joined(sync)?;
            }
            self.syncing
                .push(std::thread::spawn(move || file.sync_all()));
        }
        self.serial += 1;
        let stamp = proto::time::Timestamp::now().unix_secs();
        let name = format!(
            "crawl-{}-{stamp}-{:05}.warc.gz",
            self.worker_id, self.serial
        );
        let path = self.dir.join(&name);
        let file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)?;
        self.current = Some((file, path));
        self.written = 0;
        let info = format!(
            "software: crawl-frontier worker {}\r\nformat: WARC File Format 1.1\r\nconformsTo: http://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/\r\nisPartOf: {}\r\n",
            env!("CARGO_PKG_VERSION"),
            self.worker_id
        );
        let header = record_header(&[
            (WarcHeader::WarcType, "warcinfo".into()),
            (WarcHeader::Filename, name),
            (WarcHeader::ContentType, "application/warc-fields".into()),
        ]);
        self.append(&record_member(header, info.as_bytes())?)?;
        self.current
            .as_mut()
            .map(|(file, _)| file)
            .ok_or_else(|| io::Error::other("no file"))
    }

    /// Appends gzip members whole.
    fn append(&mut self, members: &[u8]) -> io::Result<()> {
        let file = match self.current.as_mut() {
            Some((file, _)) => file,
            None => return Err(io::Error::other("no WARC file open")),
        };
        file.write_all(members)?;
        self.written += members.len() as u64;
        Ok(())
    }
}

fn record_header(fields: &[(WarcHeader, String)]) -> RawRecordHeader {
    let mut headers: std::collections::HashMap<WarcHeader, Vec<u8>> = fields
        .iter()
        .map(|(key, value)| (key.clone(), value.clone().into_bytes()))
        .collect();
    headers.insert(
        WarcHeader::RecordID,
        format!("<urn:uuid:{}>", uuid_v4()).into_bytes(),
    );
    headers
        .entry(WarcHeader::Date)
        .or_insert_with(|| warc_date().into_bytes());
    RawRecordHeader {
        version: "1.1".into(),
        headers,
    }
}

/// A random UUID (version 4) from the OS's randomness, formatted.
fn uuid_v4() -> String {
    let id = warc::Record::<warc::BufferedBody>::generate_record_id();
    // generate_record_id gives "<urn:uuid:...>"; keep the UUID only.
    id.trim_start_matches("<urn:uuid:")
        .trim_end_matches('>')
        .to_owned()
}

/// How a revisit record knows the page is as captured before (WARC 1.1
/// revisit profiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevisitProfile {
    /// The payload's digest equals the earlier capture's.
    IdenticalPayloadDigest,
    /// The server answered 304 Not Modified.
    ServerNotModified,
}

impl RevisitProfile {
    /// The profile's URI, as WARC-Profile carries it.
    #[must_use]
    pub fn uri(self) -> &'static str {
        match self {
            Self::IdenticalPayloadDigest => {
                "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
            }
            Self::ServerNotModified => {
                "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
            }
        }
    }
}

/// What a revisit record refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revisit {
    pub profile: RevisitProfile,
    /// The earlier capture's target URI.
    pub refers_to_uri: String,
    /// The earlier capture's date (UTC epoch seconds), when known.
    pub refers_to_date: Option<u64>,
    /// With identical-payload-digest: the digest both payloads have.
    pub payload_digest: Option<String>,
}

/// A response's HTTP head as archived: the status line and headers, less
/// the transfer's own (the body is stored decoded), and its length.
fn http_head(fetched: &Fetched) -> Vec<u8> {
    let mut http = Vec::with_capacity(1024);
    let version = match fetched.version.as_str() {
        "HTTP/2.0" => "HTTP/2",
        other => other,
    };
    let reason = reqwest::StatusCode::from_u16(fetched.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    http.extend_from_slice(format!("{version} {} {reason}\r\n", fetched.status).as_bytes());
    for (name, value) in &fetched.headers {
        if ["content-encoding", "transfer-encoding", "content-length"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        http.extend_from_slice(name.as_bytes());
        http.extend_from_slice(b": ");
        http.extend_from_slice(value);
        http.extend_from_slice(b"\r\n");
    }
    http.extend_from_slice(format!("content-length: {}\r\n\r\n", fetched.body.len()).as_bytes());
    http
}

/// The worker's output directory.
pub struct Output {
    warc: Mutex<WarcFile>,
    log: Mutex<BufWriter<File>>,
    dir: PathBuf,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output").field("dir", &self.dir).finish()
    }
}

impl Output {
    /// Opens (creating) the directory; files are named after `worker_id`.
    pub fn open(dir: &Path, worker_id: &str, warc_max_bytes: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("crawl-{worker_id}.log.jsonl")))?;
        Ok(Self {
            warc: Mutex::new(WarcFile {
                dir: dir.to_owned(),
                worker_id: worker_id.to_owned(),
                max_bytes: warc_max_bytes.max(1),
                current: None,
                written: 0,
                serial: 0,
                syncing: Vec::new(),
            }),
            log: Mutex::new(BufWriter::new(log)),
            dir: dir.to_owned(),
        })
    }

    /// Writes a fetch's request and response records; answers the
    /// payload digest. Short enough for an async task: one write to the
    /// page cache, and a rotated file is synced on a thread of its own.
    pub fn write_exchange(
        &self,
        url: &str,
        request_head: &[u8],
        fetched: &Fetched,
    ) -> io::Result<String> {
        let payload_digest = digest(&fetched.body);
        let now = proto::time::Timestamp::now().unix_secs();
        self.write_response(url, request_head, fetched, &payload_digest, now)?;
        Ok(payload_digest)
    }

    /// [`Self::write_exchange`] with the payload's digest computed already,
    /// and the response record dated `captured` (UTC epoch seconds), the
    /// date later revisit records refer to.
    pub fn write_response(
        &self,
        url: &str,
        request_head: &[u8],
        fetched: &Fetched,
        payload_digest: &str,
        captured: u64,
    ) -> io::Result<()> {
        // The HTTP message's head; its body is the page's, not copied.
        let http = http_head(fetched);
        let block = [http.as_slice(), &fetched.body];

        let mut response_fields = vec![
            (WarcHeader::WarcType, "response".to_owned()),
            (WarcHeader::TargetURI, url.to_owned()),
            (WarcHeader::Date, iso_date(captured)),
            (
                WarcHeader::ContentType,
                "application/http; msgtype=response".to_owned(),
            ),
            (WarcHeader::PayloadDigest, payload_digest.to_owned()),
            (WarcHeader::BlockDigest, digest_of_parts(&block)),
        ];
        if let Some(peer) = fetched.peer {
            response_fields.push((WarcHeader::IPAddress, peer.ip().to_string()));
        }
        if fetched.truncated {
            response_fields.push((WarcHeader::Truncated, "length".to_owned()));
        }
        self.write_pair(url, request_head, &response_fields, &block)
    }

    /// Writes a fetch that found the page as an earlier capture had it: a
    /// `revisit` record (WARC 1.1, section 6.7) with the HTTP head only,
    /// referring to that capture, and its request. `profile` says how it
    /// is known: the same payload digest, or a 304.
    pub fn write_revisit(
        &self,
        url: &str,
        request_head: &[u8],
        fetched: &Fetched,
        revisit: &Revisit,
    ) -> io::Result<()> {
        let http = http_head(fetched);
        let mut fields = vec![
            (WarcHeader::WarcType, "revisit".to_owned()),
            (WarcHeader::TargetURI, url.to_owned()),
            (
                WarcHeader::ContentType,
                "application/http; msgtype=response".to_owned(),
            ),
            (WarcHeader::Profile, revisit.profile.uri().to_owned()),
            (
                WarcHeader::Unknown("WARC-Refers-To-Target-URI".to_owned()),
                revisit.refers_to_uri.clone(),
            ),
            (WarcHeader::BlockDigest, digest(&http)),
        ];
        if let Some(date) = revisit.refers_to_date {
            fields.push((
                WarcHeader::Unknown("WARC-Refers-To-Date".to_owned()),
                iso_date(date),
            ));
        }
        if let Some(payload) = &revisit.payload_digest {
            fields.push((WarcHeader::PayloadDigest, payload.clone()));
        }
        if let Some(peer) = fetched.peer {
            fields.push((WarcHeader::IPAddress, peer.ip().to_string()));
        }
        self.write_pair(url, request_head, &fields, &[http.as_slice()])
    }

    /// A response-like record (`fields`, `block`) and its request record.
    fn write_pair(
        &self,
        url: &str,
        request_head: &[u8],
        fields: &[(WarcHeader, String)],
        block: &[&[u8]],
    ) -> io::Result<()> {
        let response = record_header(fields);
        let response_id = response
            .headers
            .get(&WarcHeader::RecordID)
            .map(|id| String::from_utf8_lossy(id).into_owned())
            .unwrap_or_default();
        let request = record_header(&[
            (WarcHeader::WarcType, "request".to_owned()),
            (WarcHeader::TargetURI, url.to_owned()),
            (
                WarcHeader::ContentType,
                "application/http; msgtype=request".to_owned(),
            ),
            (WarcHeader::ConcurrentTo, response_id),
        ]);
        // Compressed before the lock, written in one call under it: the
        // pair stays together and concurrent fetches only queue for the
        // write itself.
        let mut members = record_member(request, request_head)?;
        append_record_member(&mut members, response, block)?;
        let mut warc = self.warc.lock().unwrap_or_else(PoisonError::into_inner);
        warc.writer()?;
        warc.append(&members)
    }

    /// Appends one crawl log line.
    pub fn log(&self, entry: &crate::report::CrawlLogEntry) -> io::Result<()> {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        serde_json::to_writer(&mut *log, entry)?;
        log.write_all(b"\n")?;
        Ok(())
    }

    /// Flushes and syncs the log and the current WARC file.
    pub fn flush(&self) -> io::Result<()> {
        {
            let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
            log.flush()?;
            log.get_ref().sync_all()?;
        }
        let mut warc = self.warc.lock().unwrap_or_else(PoisonError::into_inner);
        for sync in warc.syncing.drain(..) {
            joined(sync)?;
        }
        if let Some((file, _)) = warc.current.as_mut() {
            file.flush()?;
            file.sync_all()?;
        }
        Ok(())
    }
}

/// One record of a WARC file, as [`read_archive`] reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedRecord {
    /// WARC-Type: `request`, `response`, `warcinfo`, ...
    pub kind: String,
    /// WARC-Target-URI (empty for records without one).
    pub target: String,
    /// The record block: the HTTP message as recorded.
    pub block: Vec<u8>,
    /// The WARC version the record declares (`1.1`).
    pub version: String,
    /// Of its fields, those that tie captures together (WARC-Date,
    /// WARC-Payload-Digest, and a revisit's WARC-Profile and Refers-To
    /// fields), by lower-case name, where present.
    pub fields: std::collections::BTreeMap<String, String>,
}

/// Reads every record of the `.warc.gz` files in `dir`, files in name
/// order (so one worker's records come in the order written).
pub fn read_archive(dir: &Path) -> io::Result<Vec<ArchivedRecord>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.to_string_lossy().ends_with(".warc.gz"))
        .collect();
    files.sort();
    let mut records = Vec::new();
    for file in files {
        let reader = warc::WarcReader::new(io::BufReader::new(flate2::read::MultiGzDecoder::new(
            File::open(&file)?,
        )));
        for record in reader.iter_records() {
            let record = record.map_err(|error| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} does not parse: {error}", file.display()),
                )
            })?;
            let fields = [
                "warc-profile",
                "warc-refers-to-target-uri",
                "warc-refers-to-date",
                "warc-payload-digest",
                "warc-date",
            ]
            .into_iter()
            .filter_map(|name| {
                let value = match name {
                    "warc-profile" => record.header(WarcHeader::Profile),
                    "warc-payload-digest" => record.header(WarcHeader::PayloadDigest),
                    "warc-date" => record.header(WarcHeader::Date),
                    other => record.header(WarcHeader::Unknown(other.to_owned())),
                }?;
                Some((name.to_owned(), value.into_owned()))
            })
            .collect();
            records.push(ArchivedRecord {
                version: record.warc_version().to_owned(),
                fields,
                kind: record.warc_type().to_string(),
                target: record
                    .header(WarcHeader::TargetURI)
                    .map(|t| t.into_owned())
                    .unwrap_or_default(),
                block: record.body().to_vec(),
            });
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::time::Duration;

    use super::*;

    fn fetched(body: &[u8]) -> Fetched {
        Fetched {
            status: 200,
            version: "HTTP/1.1".into(),
            headers: vec![
                ("content-type".into(), b"text/html".to_vec()),
                ("content-encoding".into(), b"gzip".to_vec()),
            ],
            body: bytes::Bytes::copy_from_slice(body),
            truncated: false,
            peer: None,
            duration: Duration::from_millis(3),
            budget: None,
        }
    }

    #[test]
    fn records_read_back_one_by_one_and_files_rotate() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path(), "w1", 2_000).unwrap();
        for i in 0..10 {
            let body = format!("<html>page {i} {}</html>", "x".repeat(500));
            output
                .write_exchange(
                    &format!("http://s.example/{i}"),
                    b"GET / HTTP/1.1\r\nhost: s.example\r\n\r\n",
                    &fetched(body.as_bytes()),
                )
                .unwrap();
        }
        output.flush().unwrap();
        let files = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .to_string_lossy()
                    .ends_with(".warc.gz")
            })
            .count();
        assert!(files > 1, "rotated at 2,000 bytes");
        let mut responses = 0;
        for record in read_warc(dir.path()) {
            if record.warc_type() == &warc::RecordType::Response {
                responses += 1;
                let body = String::from_utf8_lossy(record.body());
                assert!(body.starts_with("HTTP/1.1 200 OK\r\n"));
                assert!(!body.to_ascii_lowercase().contains("content-encoding"));
            }
        }
        assert_eq!(responses, 10);
    }

    #[test]
    fn revisit_records_refer_to_the_earlier_capture_in_either_profile() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path(), "w1", 1 << 20).unwrap();
        let url = "http://s.example/a";
        let first = output
            .write_exchange(url, b"GET /a HTTP/1.1\r\n\r\n", &fetched(b"<html>a</html>"))
            .unwrap();
        let same = Revisit {
            profile: RevisitProfile::IdenticalPayloadDigest,
            refers_to_uri: url.to_owned(),
            refers_to_date: Some(1_795_000_000),
            payload_digest: Some(first.clone()),
        };
        output
            .write_revisit(
                url,
                b"GET /a HTTP/1.1\r\n\r\n",
                &fetched(b"<html>a</html>"),
                &same,
            )
            .unwrap();
        let not_modified = Fetched {
            status: 304,
            ..fetched(b"")
        };
        let told = Revisit {
            profile: RevisitProfile::ServerNotModified,
            payload_digest: None,
            ..same.clone()
        };
        output
            .write_revisit(url, b"GET /a HTTP/1.1\r\n\r\n", &not_modified, &told)
            .unwrap();
        output.flush().unwrap();
        let revisits: Vec<(String, String, String, Option<String>, String)> = read_warc(dir.path())
            .into_iter()
            .filter(|record| record.warc_type() == &warc::RecordType::Revisit)
            .map(|record| {
                let header = |name: &str| {
                    record
                        .header(WarcHeader::Unknown(name.to_owned()))
                        .map(|v| v.into_owned())
                };
                (
                    record.header(WarcHeader::Profile).unwrap().into_owned(),
                    header("warc-refers-to-target-uri").unwrap(),
                    header("warc-refers-to-date").unwrap(),
                    record
                        .header(WarcHeader::PayloadDigest)
                        .map(|v| v.into_owned()),
                    String::from_utf8_lossy(record.body()).into_owned(),
                )
            })
            .collect();
        assert_eq!(revisits.len(), 2);
        assert_eq!(revisits[0].0, RevisitProfile::IdenticalPayloadDigest.uri());
        assert_eq!(revisits[0].1, url);
        assert_eq!(revisits[0].2, "2026-11-18T11:06:40Z");
        assert_eq!(revisits[0].3.as_deref(), Some(first.as_str()));
        assert!(revisits[0].4.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(revisits[0].4.ends_with("\r\n\r\n"), "the head only");
        assert_eq!(revisits[1].0, RevisitProfile::ServerNotModified.uri());
        assert_eq!(revisits[1].3, None);
        assert!(revisits[1].4.starts_with("HTTP/1.1 304 Not Modified\r\n"));
    }

    /// Every record of the WARC files in `dir`.
    fn read_warc(dir: &Path) -> Vec<warc::Record<warc::BufferedBody>> {
        let mut records = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().ends_with(".warc.gz") {
                continue;
            }
            let reader = warc::WarcReader::new(BufReader::new(flate2::read::MultiGzDecoder::new(
                File::open(&path).unwrap(),
            )));
            records.extend(reader.iter_records().map(Result::unwrap));
        }
        records
    }

    /// `data` as one gzip member, through a reused compressor.
    fn gzip_member(deflate: &mut flate2::Compress, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut member = GzipMember::start(deflate, &mut out, data.len() / 2);
        // In pieces, as a record's parts are fed.
        for piece in data.chunks(7_001) {
            member.feed(piece)?;
        }
        member.finish()?;
        Ok(out)
    }

    proptest::proptest! {
        #[test]
        fn a_reused_compressor_makes_members_that_read_back(
            records in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..70_000),
                1..4,
            ),
        ) {
            let mut deflate = flate2::Compress::new(flate2::Compression::fast(), false);
            let mut file = Vec::new();
            for record in &records {
                let member = gzip_member(&mut deflate, record).unwrap();
                let mut one = Vec::new();
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&member[..]), &mut one)
                    .unwrap();
                proptest::prop_assert_eq!(&one, record);
                file.extend_from_slice(&member);
            }
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&file[..]), &mut all)
                .unwrap();
            proptest::prop_assert_eq!(all, records.concat());
        }
    }

    #[test]
    fn dates_are_iso_utc() {
        assert_eq!(iso_date(1_700_000_000), "2023-11-14T22:13:20Z");
    }
}
