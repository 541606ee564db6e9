//! What one commit cycle does, and in which order, per delivery mode
//! (`kafka.delivery`): a pure plan of [`Step`]s and the one driver that
//! runs it over a [`Steps`] implementation. The live implementation
//! (`cycle::commit`) talks to Kafka and RocksDB; the tests below run
//! every mode over a recording fake, failing each step in turn.
//!
//! No Kafka, RocksDB or clock here.

use crate::config::Delivery;

/// One step of a commit cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// For every input partition the cycle touched: its state records,
    /// (outbox mode) its events as outbox chunks, then its cycle marker,
    /// to the changelog partition of the same number.
    SendChangelog,
    /// Wait until every record sent so far is acknowledged; what the wait
    /// is for names it in errors and logs.
    Flush(Flushed),
    /// `exactly_once`: the input offsets join the open transaction.
    SendOffsetsToTransaction,
    /// `exactly_once`: events, changelog and offsets become visible at once.
    CommitTransaction,
    /// Start writing the cycle's records to RocksDB with the changelog
    /// position they reflect (only ever after the changelog holds them).
    WriteState,
    /// Outbox mode: publish the cycle's held events (explicit partitions,
    /// origin header).
    PublishOutbox,
    /// Commit the input offsets to the consumer group.
    CommitOffsets,
}

/// What a [`Step::Flush`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushed {
    Events,
    Changelog,
}

impl Flushed {
    pub fn what(self) -> &'static str {
        match self {
            Flushed::Events => "flush events",
            Flushed::Changelog => "flush changelog",
        }
    }
}

use Step::*;

/// The steps of one cycle in `mode`, in order.
pub fn plan(mode: Delivery) -> &'static [Step] {
    match mode {
        // Events were sent inside the transaction as they were emitted.
        Delivery::ExactlyOnce => &[
            SendChangelog,
            SendOffsetsToTransaction,
            CommitTransaction,
            WriteState,
        ],
        // Events are held until the changelog holds them (as outbox
        // chunks): whoever restores an interrupted cycle publishes them.
        Delivery::ExactlyOnceOutbox => &[
            SendChangelog,
            Flush(Flushed::Changelog),
            WriteState,
            PublishOutbox,
            Flush(Flushed::Events),
            CommitOffsets,
        ],
        // Events were sent as emitted: acknowledged first, so a crash can
        // only repeat them.
        Delivery::AtLeastOnce => &[
            Flush(Flushed::Events),
            SendChangelog,
            Flush(Flushed::Changelog),
            WriteState,
            CommitOffsets,
        ],
    }
}

/// The step after which the cycle is durable (a restart restores it): from
/// then on a failure must not abort it.
pub fn durable_after(mode: Delivery) -> Step {
    match mode {
        Delivery::ExactlyOnce => CommitTransaction,
        Delivery::ExactlyOnceOutbox | Delivery::AtLeastOnce => Flush(Flushed::Changelog),
    }
}

/// Whether events wait in an outbox until the changelog holds them,
/// instead of being sent as they are emitted.
pub fn holds_events(mode: Delivery) -> bool {
    mode == Delivery::ExactlyOnceOutbox
}

/// How a mode's plan is split when a cycle's commit overlaps the next
/// cycle: `on_loop` runs on the poll loop, `off_loop` on a committer
/// thread while the poll loop goes on reading and processing the next
/// cycle's records (nothing of which reaches Kafka until the commit has
/// answered), `landed` on the poll loop once the committer has succeeded.
/// Concatenated, the three are the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub on_loop: &'static [Step],
    pub off_loop: &'static [Step],
    pub landed: &'static [Step],
}

/// Where `mode`'s cycle may overlap the next: `exactly_once` waits for
/// its transaction's answer (offsets into the transaction, the commit: two
/// round trips to the coordinator and the flush of every record) on a
/// thread of its own. The next cycle produces nothing until that answer
/// is in: a cycle's transaction is begun only after the one before it
/// committed, so a committed transaction never rests on one that was not
/// (docs/decisions.md, "Overlapped commits"). The other modes commit on
/// the poll loop: their changelog and offsets are separate writes, not
/// one transaction a thread could finish on its own.
pub fn overlap(mode: Delivery) -> Option<Split> {
    match mode {
        Delivery::ExactlyOnce => {
            let p = plan(mode);
            Some(Split {
                on_loop: &p[..1],
                off_loop: &p[1..3],
                landed: &p[3..],
            })
        }
        Delivery::ExactlyOnceOutbox | Delivery::AtLeastOnce => None,
    }
}

/// The side effects of a cycle, one call per step.
pub trait Steps {
    type Error;
    fn run(&mut self, step: Step) -> Result<(), Self::Error>;
    /// The cycle is durable ([`durable_after`]): it is no longer open.
    fn durable(&mut self);
}

/// Runs `mode`'s plan over `steps`, stopping at the first failure (the
/// caller then aborts whatever of the cycle is not durable).
pub fn drive<S: Steps>(mode: Delivery, steps: &mut S) -> Result<(), S::Error> {
    drive_part(mode, plan(mode), steps)
}

/// Runs `part` of `mode`'s plan (a [`Split`]'s third) over `steps`, as
/// [`drive`] does.
pub fn drive_part<S: Steps>(mode: Delivery, part: &[Step], steps: &mut S) -> Result<(), S::Error> {
    let durable = durable_after(mode);
    for &step in part {
        steps.run(step)?;
        if step == durable {
            steps.durable();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODES: [Delivery; 3] = [
        Delivery::ExactlyOnce,
        Delivery::ExactlyOnceOutbox,
        Delivery::AtLeastOnce,
    ];

    /// Records every step and what a broker and a store would hold after
    /// it; fails the step numbered `fail_at`.
    #[derive(Default)]
    struct Recorder {
        fail_at: Option<usize>,
        ran: Vec<Step>,
        durable_at: Option<usize>,
        changelog_sent: bool,
        changelog_acked: bool,
        in_txn_offsets: bool,
        /// The group's offsets moved to this cycle's end.
        offsets_committed: bool,
        /// Events readers can see (acknowledged or committed).
        events_visible: bool,
        state_written_before_durable: bool,
        state_written: bool,
        published: bool,
    }

    impl Recorder {
        fn failing_at(n: usize) -> Recorder {
            Recorder {
                fail_at: Some(n),
                ..Recorder::default()
            }
        }
    }

    impl Steps for Recorder {
        type Error = Step;

        fn run(&mut self, step: Step) -> Result<(), Step> {
            if self.fail_at == Some(self.ran.len()) {
                return Err(step);
            }
            self.ran.push(step);
            match step {
                SendChangelog => self.changelog_sent = true,
                Flush(Flushed::Changelog) => self.changelog_acked = self.changelog_sent,
                Flush(Flushed::Events) => self.events_visible = true,
                SendOffsetsToTransaction => self.in_txn_offsets = true,
                CommitTransaction => {
                    self.changelog_acked = self.changelog_sent;
                    self.offsets_committed = self.in_txn_offsets;
                    self.events_visible = true;
                }
                WriteState => {
                    self.state_written = true;
                    self.state_written_before_durable = self.durable_at.is_none();
                }
                PublishOutbox => self.published = true,
                CommitOffsets => self.offsets_committed = true,
            }
            Ok(())
        }

        fn durable(&mut self) {
            self.durable_at = Some(self.ran.len());
        }
    }

    #[test]
    fn each_mode_commits_in_its_documented_order() {
        let ran = |mode| {
            let mut r = Recorder::default();
            drive(mode, &mut r).unwrap();
            r.ran
        };
        assert_eq!(
            ran(Delivery::ExactlyOnce),
            [
                SendChangelog,
                SendOffsetsToTransaction,
                CommitTransaction,
                WriteState
            ]
        );
        assert_eq!(
            ran(Delivery::ExactlyOnceOutbox),
            [
                SendChangelog,
                Flush(Flushed::Changelog),
                WriteState,
                PublishOutbox,
                Flush(Flushed::Events),
                CommitOffsets
            ]
        );
        assert_eq!(
            ran(Delivery::AtLeastOnce),
            [
                Flush(Flushed::Events),
                SendChangelog,
                Flush(Flushed::Changelog),
                WriteState,
                CommitOffsets
            ]
        );
    }

    /// A whole cycle leaves the offsets committed, the events visible, the
    /// state written after the changelog holds it, and is durable exactly
    /// when the changelog is.
    #[test]
    fn a_whole_cycle_ends_committed_in_every_mode() {
        for mode in MODES {
            let mut r = Recorder::default();
            drive(mode, &mut r).unwrap();
            assert!(r.offsets_committed, "{mode}");
            assert!(r.events_visible, "{mode}");
            assert!(r.state_written && !r.state_written_before_durable, "{mode}");
            assert!(r.changelog_acked, "{mode}");
            assert_eq!(r.published, holds_events(mode), "{mode}");
            let d = r.durable_at.expect("durable");
            assert_eq!(r.ran[d - 1], durable_after(mode), "{mode}");
        }
    }

    /// A failure at any step stops the cycle there: nothing after it runs,
    /// the offsets are committed only if the failure came after their
    /// commit, RocksDB is never written before the changelog holds the
    /// cycle, and offsets never move before the events are acknowledged
    /// and the changelog holds the cycle.
    #[test]
    fn a_failure_at_any_step_commits_none_of_the_cycles_offsets() {
        for mode in MODES {
            let steps = plan(mode);
            let commit_at = steps
                .iter()
                .position(|s| matches!(s, CommitOffsets | CommitTransaction))
                .expect("every mode commits offsets");
            for fail_at in 0..steps.len() {
                let mut r = Recorder::failing_at(fail_at);
                assert_eq!(
                    drive(mode, &mut r),
                    Err(steps[fail_at]),
                    "{mode} at {fail_at}"
                );
                assert_eq!(
                    r.ran,
                    steps[..fail_at],
                    "{mode}: nothing runs after a failure"
                );
                assert_eq!(
                    r.offsets_committed,
                    fail_at > commit_at,
                    "{mode} failing at {:?}",
                    steps[fail_at]
                );
                if r.offsets_committed {
                    assert!(r.changelog_acked && r.events_visible, "{mode} at {fail_at}");
                }
                assert!(!r.state_written_before_durable, "{mode} at {fail_at}");
                // Durable exactly when the durable step ran.
                let durable_ran = r.ran.contains(&durable_after(mode));
                assert_eq!(r.durable_at.is_some(), durable_ran, "{mode} at {fail_at}");
            }
        }
    }

    /// An overlapped cycle runs the same steps in the same order, is
    /// durable off the poll loop, and writes RocksDB only once landed.
    #[test]
    fn an_overlapped_cycle_is_the_plan_split_in_three() {
        for mode in MODES {
            let Some(split) = overlap(mode) else {
                assert!(!mode.transactional(), "{mode}");
                continue;
            };
            let joined: Vec<Step> = [split.on_loop, split.off_loop, split.landed].concat();
            assert_eq!(joined, plan(mode), "{mode}");
            assert!(split.off_loop.contains(&durable_after(mode)), "{mode}");
            assert!(!split.on_loop.contains(&CommitTransaction), "{mode}");
            assert_eq!(split.landed, [WriteState], "{mode}");
            // Driven third by third, it ends where a whole cycle does.
            let mut r = Recorder::default();
            for part in [split.on_loop, split.off_loop, split.landed] {
                drive_part(mode, part, &mut r).unwrap();
            }
            assert!(r.offsets_committed && r.events_visible && r.state_written);
            assert!(!r.state_written_before_durable);
        }
    }

    #[test]
    fn only_exactly_once_is_transactional_and_only_the_outbox_holds_events() {
        for mode in MODES {
            assert_eq!(
                mode.transactional(),
                plan(mode).contains(&CommitTransaction),
                "{mode}"
            );
            assert_eq!(
                holds_events(mode),
                plan(mode).contains(&PublishOutbox),
                "{mode}"
            );
        }
    }
}
