//! How a batch of discovered URLs that carries its page's report is
//! routed over the URLs' owners: every other owner's share first, then the
//! report owner's share, with the report only if every other share was
//! stored, so that a page is never done while one of its outlinks is not
//! durable where it lives. The router sends the shares over gRPC; the
//! simulation (`sim::batches`) delivers them to in-memory nodes with
//! faults, through these same decisions.

use proto::urlfrontier as uf;

const FAIL: i32 = uf::ack_message::Status::Fail as i32;

/// The order a batch's shares go in.
#[derive(Debug)]
pub(in crate::cluster) struct BatchRoute<O> {
    /// Shares sent first, all at once.
    pub(in crate::cluster) first: Vec<(O, Vec<usize>)>,
    /// The report owner's share, sent once the first are answered; its
    /// indexes hold the report's ([`report_index`]).
    pub(in crate::cluster) last: Option<(O, Vec<usize>)>,
}

/// The index that stands for a batch's report among its items' indexes:
/// one past the items, so it names none of them.
pub(in crate::cluster) fn report_index(items: usize) -> usize {
    items
}

/// Orders the shares of a batch of `items` URLs (each owner with the
/// indexes of its URLs, the report's index with its owner's): the report
/// owner's share last, when the batch carries a report.
pub(in crate::cluster) fn route<O>(
    mut shares: Vec<(O, Vec<usize>)>,
    items: usize,
    carries_report: bool,
) -> BatchRoute<O> {
    let report = report_index(items);
    let last = shares
        .iter()
        .position(|(_, indexes)| indexes.contains(&report))
        .filter(|_| carries_report)
        .map(|at| shares.remove(at));
    BatchRoute {
        first: shares,
        last,
    }
}

/// What an owner answered for its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::cluster) enum ShareAnswer {
    /// Its commit's statuses, one per URL sent, and the report's status
    /// when the share carried it (`None`: an owner that takes no reports
    /// in batches, and the client then sends it by PutURLs).
    Answered {
        statuses: Vec<i32>,
        report: Option<i32>,
    },
    /// Not stored as far as the sender knows: the owner could not be
    /// reached, or its answer was lost (it may have stored the share; the
    /// client sends it again, which stores nothing twice).
    NotStored,
}

/// A batch's answer, built share by share.
#[derive(Debug)]
pub(in crate::cluster) struct BatchAnswers {
    statuses: Vec<i32>,
    report_index: usize,
    /// No URL so far is known not stored.
    all_stored: bool,
    report: Option<i32>,
}

impl BatchAnswers {
    /// A batch of `items` URLs, each FAIL until its owner answers; with
    /// `some_away`, some URLs have no owner to send them to.
    pub(in crate::cluster) fn new(items: usize, carries_report: bool, some_away: bool) -> Self {
        Self {
            statuses: vec![FAIL; items],
            report_index: report_index(items),
            all_stored: !some_away,
            report: carries_report.then_some(FAIL),
        }
    }

    /// Whether the report may go to its owner now: every URL sent so far
    /// stored, and none without an owner.
    pub(in crate::cluster) fn report_may_go(&self) -> bool {
        self.all_stored
    }

    /// Places a share's answer; `carried_report` says whether the share
    /// carried the report, whose status it then sets.
    pub(in crate::cluster) fn place(
        &mut self,
        indexes: &[usize],
        answer: ShareAnswer,
        carried_report: bool,
    ) {
        let items: Vec<usize> = (indexes.iter().copied())
            .filter(|&i| i != self.report_index)
            .collect();
        let report = match answer {
            ShareAnswer::Answered { statuses, report } if statuses.len() == items.len() => {
                for (index, status) in items.into_iter().zip(statuses) {
                    self.all_stored &= status != FAIL;
                    self.statuses[index] = status;
                }
                report
            }
            ShareAnswer::Answered { .. } => {
                tracing::warn!("an owner answered a batch's share short; its URLs are FAIL");
                self.all_stored = false;
                Some(FAIL)
            }
            ShareAnswer::NotStored => {
                self.all_stored = false;
                Some(FAIL)
            }
        };
        if carried_report {
            self.report = report;
        }
    }

    /// The statuses in the batch's order, and the report's.
    pub(in crate::cluster) fn finish(self) -> (Vec<i32>, Option<i32>) {
        (self.statuses, self.report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: i32 = uf::ack_message::Status::Ok as i32;

    #[test]
    fn the_report_owners_share_goes_last_and_only_with_a_report() {
        let shares = vec![("a", vec![0, 3]), ("b", vec![1, 4]), ("c", vec![2])];
        let carried = route(shares.clone(), 4, true);
        assert_eq!(carried.last, Some(("b", vec![1, 4])));
        assert_eq!(carried.first, vec![("a", vec![0, 3]), ("c", vec![2])]);
        let plain = route(shares, 4, false);
        assert_eq!(plain.last, None);
        assert_eq!(plain.first.len(), 3);
    }

    #[test]
    fn one_share_not_stored_keeps_the_report_back_and_fails_it() {
        let mut answers = BatchAnswers::new(3, true, false);
        let ok = |n| ShareAnswer::Answered {
            statuses: vec![OK; n],
            report: None,
        };
        answers.place(&[0], ok(1), false);
        assert!(answers.report_may_go());
        answers.place(&[1], ShareAnswer::NotStored, false);
        assert!(!answers.report_may_go());
        // The last share goes without the report.
        answers.place(&[2, 3], ok(1), false);
        assert_eq!(answers.finish(), (vec![OK, FAIL, OK], Some(FAIL)));
    }

    #[test]
    fn a_fail_status_or_a_short_answer_counts_as_not_stored() {
        let mut failed = BatchAnswers::new(2, true, false);
        let answer = ShareAnswer::Answered {
            statuses: vec![OK, FAIL],
            report: None,
        };
        failed.place(&[0, 1], answer, false);
        assert!(!failed.report_may_go());
        let mut short = BatchAnswers::new(2, true, false);
        let answer = ShareAnswer::Answered {
            statuses: vec![OK],
            report: None,
        };
        short.place(&[0, 1], answer, false);
        assert!(!short.report_may_go());
        assert_eq!(short.finish().0, vec![FAIL, FAIL]);
        assert!(!BatchAnswers::new(1, true, true).report_may_go(), "away");
    }

    #[test]
    fn the_report_takes_its_owners_answer_unset_included() {
        let mut answers = BatchAnswers::new(1, true, false);
        let answer = ShareAnswer::Answered {
            statuses: vec![OK],
            report: Some(OK),
        };
        answers.place(&[0, 1], answer, true);
        assert_eq!(answers.finish(), (vec![OK], Some(OK)));
        let mut older = BatchAnswers::new(0, true, false);
        let answer = ShareAnswer::Answered {
            statuses: vec![],
            report: None,
        };
        older.place(&[0], answer, true);
        assert_eq!(
            older.finish(),
            (vec![], None),
            "an owner without reports in batches"
        );
        assert_eq!(BatchAnswers::new(2, false, false).finish().1, None);
    }
}
