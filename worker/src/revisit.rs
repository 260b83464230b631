//! A page fetched again: what the frontier served of its last fetch (the
//! validators, the payload digest, the capture's date) turned into a
//! conditional request, and the answer judged changed or unchanged. An
//! unchanged page (a 304, or the same payload digest) is archived as a
//! WARC revisit record referring to the earlier capture, and its outlinks
//! are not sent again. The finding goes back in the report, and the
//! frontier picks the next fetch from it.

use std::collections::BTreeMap;

use proto::metadata::{self, RevisitState};
use proto::urlfrontier::StringList;

use crate::fetch::{Fetched, Validators};
use crate::frontier_link::meta_value;
use crate::output::{Revisit, RevisitProfile, digest};

/// What the frontier served of a page's last fetch, if anything.
fn served_state(metadata: &BTreeMap<String, StringList>) -> RevisitState {
    metadata
        .get(metadata::REVISIT)
        .and_then(|list| RevisitState::of(&list.values))
        .unwrap_or_default()
}

/// The validators of a page's last fetch, as the frontier served them.
#[must_use]
pub fn validators_of(metadata: &BTreeMap<String, StringList>) -> Validators {
    let state = served_state(metadata);
    Validators {
        etag: state.etag,
        last_modified: state.last_modified,
    }
}

/// What a fetch that reached the page found, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    /// Whether the content changed since the last capture.
    pub changed: bool,
    /// The validators to send next time.
    pub validators: Validators,
    /// The payload digest of the content now held, and when that content
    /// was captured (UTC epoch seconds).
    pub digest: Option<String>,
    pub captured: Option<u64>,
    /// Set when the page is as captured before: the revisit record to
    /// write instead of the response.
    pub revisit: Option<Revisit>,
}

impl Capture {
    /// Judges an answer (a 2xx or a 304) against what the frontier served
    /// of the last fetch; `now` dates a new capture.
    #[must_use]
    pub fn of(
        url: &str,
        served: &BTreeMap<String, StringList>,
        fetched: &Fetched,
        now: u64,
    ) -> Self {
        let state = served_state(served);
        let (last_digest, last_captured) = (state.digest, state.captured);
        let last = Validators {
            etag: state.etag,
            last_modified: state.last_modified,
        };
        // A 304 keeps the validators it was asked with, unless it sends
        // newer ones (RFC 9110 lets it).
        let validators = Validators {
            etag: fetched.header("etag").map(str::to_owned).or(last.etag),
            last_modified: fetched
                .header("last-modified")
                .map(str::to_owned)
                .or(last.last_modified),
        };
        let earlier = |profile, payload_digest| Revisit {
            profile,
            refers_to_uri: url.to_owned(),
            refers_to_date: last_captured,
            payload_digest,
        };
        if fetched.status == 304 {
            return Self {
                changed: false,
                validators,
                revisit: Some(earlier(RevisitProfile::ServerNotModified, None)),
                digest: last_digest,
                captured: last_captured,
            };
        }
        let payload = digest(&fetched.body);
        if last_digest.as_deref() == Some(payload.as_str()) {
            return Self {
                changed: false,
                validators,
                revisit: Some(earlier(
                    RevisitProfile::IdenticalPayloadDigest,
                    Some(payload.clone()),
                )),
                digest: Some(payload),
                captured: last_captured,
            };
        }
        Self {
            changed: true,
            validators,
            revisit: None,
            digest: Some(payload),
            captured: Some(now),
        }
    }

    /// Writes the finding into a report's metadata.
    pub fn report_into(&self, metadata: &mut BTreeMap<String, StringList>) {
        let found = if self.changed { "changed" } else { "unchanged" };
        metadata.insert(metadata::FOUND.into(), meta_value(found));
        for (key, value) in [
            (metadata::ETAG, self.validators.etag.clone()),
            (
                metadata::LAST_MODIFIED,
                self.validators.last_modified.clone(),
            ),
            (metadata::DIGEST, self.digest.clone()),
            (metadata::CAPTURED, self.captured.map(|at| at.to_string())),
        ] {
            match value {
                Some(value) => metadata.insert(key.into(), meta_value(value)),
                None => metadata.remove(key),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontier_link::meta_first;

    fn answer(status: u16, body: &'static [u8], headers: &[(&str, &str)]) -> Fetched {
        Fetched {
            status,
            version: "HTTP/1.1".into(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: bytes::Bytes::from_static(body),
            truncated: false,
            peer: None,
            duration: std::time::Duration::ZERO,
            budget: None,
        }
    }

    #[test]
    fn a_page_is_judged_by_its_digest_or_a_304_and_the_report_carries_it() {
        let url = "http://s.example/a";
        let first = Capture::of(
            url,
            &BTreeMap::new(),
            &answer(200, b"a", &[("etag", "\"1\"")]),
            10,
        );
        assert!(first.changed);
        assert_eq!(first.revisit, None);
        let mut report = BTreeMap::new();
        first.report_into(&mut report);
        assert_eq!(meta_first(&report, metadata::FOUND), Some("changed"));
        assert_eq!(meta_first(&report, metadata::ETAG), Some("\"1\""));
        // Served back as the frontier keeps it: one state.
        let state = RevisitState {
            captured: first.captured,
            digest: first.digest.clone(),
            etag: first.validators.etag.clone(),
            ..RevisitState::default()
        };
        let served: BTreeMap<String, StringList> =
            [(metadata::REVISIT.to_owned(), meta_value(state.encode()))].into();
        assert_eq!(validators_of(&served).etag.as_deref(), Some("\"1\""));

        let same = Capture::of(url, &served, &answer(200, b"a", &[]), 20);
        assert!(!same.changed);
        let revisit = same.revisit.clone().unwrap();
        assert_eq!(revisit.profile, RevisitProfile::IdenticalPayloadDigest);
        assert_eq!(revisit.refers_to_date, Some(10));
        assert_eq!(same.captured, Some(10), "the capture referred to stays");
        assert_eq!(same.validators.etag.as_deref(), Some("\"1\""));

        let not_modified = Capture::of(url, &served, &answer(304, b"", &[]), 30);
        assert!(!not_modified.changed);
        assert_eq!(
            not_modified.revisit.unwrap().profile,
            RevisitProfile::ServerNotModified
        );
        assert_eq!(not_modified.digest, first.digest);

        let changed = Capture::of(url, &served, &answer(200, b"b", &[]), 40);
        assert!(changed.changed);
        assert_eq!(changed.captured, Some(40));
        let mut report = served.clone();
        changed.report_into(&mut report);
        assert_eq!(meta_first(&report, metadata::CAPTURED), Some("40"));
    }
}
