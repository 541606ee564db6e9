//! The session's side of contract §14 (`reputation.rs` has the topic's codec,
//! the group's view and its reader): what a cycle publishes, what the
//! reader brings each loop turn, and a partition taken on.

use std::sync::mpsc;

use crate::output::Route;
use crate::service::client::Tp;
use crate::service::error::{Result, ServiceError};
use crate::service::reputation::{records_of, topic_partition, Reputation};
use crate::service::session::{not_assigned, Session};
use crate::time::wall_clock;

/// Most records taken from the reader per loop turn.
const RECORDS_PER_TURN: usize = 10_000;

impl Session {
    /// A partition taken on: its tables become the group's. When the
    /// group has folded epochs the partition still needs apart, the group
    /// is read again from the topic's beginning (every partition's tables
    /// start again with it).
    pub fn attach_reputation(&mut self, tp: &Tp) -> Result<()> {
        let Some(rep) = &self.reputation else {
            return Ok(());
        };
        let needed = self
            .parts
            .get(tp)
            .ok_or_else(|| not_assigned(tp))?
            .engine()
            .oldest_epoch_needed();
        if !rep.group.can_serve(needed) {
            tracing::info!(topic = %tp.0, partition = tp.1, needed = ?needed,
                "a partition needs reputation tables older than this instance keeps: reading the reputation topic again");
            let expected = rep.group.expected.clone();
            self.reputation = Some(Reputation::start(&self.cfg, expected)?);
            let tps: Vec<Tp> = self.parts.keys().cloned().collect();
            for other in tps {
                let part = self
                    .parts
                    .get_mut(&other)
                    .ok_or_else(|| not_assigned(&other))?;
                part.share_tables(&[]);
                part.set_group_sealed(None, &mut self.updates)?;
            }
            return Ok(());
        }
        let Some(rep) = &self.reputation else {
            return Ok(());
        };
        let deltas = rep.group.export();
        let sealed = rep.group.group_sealed();
        let part = self.parts.get_mut(tp).ok_or_else(|| not_assigned(tp))?;
        part.share_tables(&deltas);
        if part.pending_batches() > 0 {
            self.ensure_cycle()?;
        }
        let part = self.parts.get_mut(tp).ok_or_else(|| not_assigned(tp))?;
        part.set_group_sealed(sealed, &mut self.updates)?;
        self.emit_updates(tp, wall_clock())
    }

    /// Takes what the reader has read: new deltas into every partition's
    /// tables, then the group's sealed epoch, which may release batches
    /// waiting at the barrier (scored in this cycle).
    pub fn reputation_turn(&mut self) -> Result<()> {
        let Some(rep) = &mut self.reputation else {
            return Ok(());
        };
        let mut n = 0;
        while n < RECORDS_PER_TURN {
            match rep.reader.rx.try_recv() {
                Ok(r) => rep.group.apply(r),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err(ServiceError::internal("the reputation reader stopped"))
                }
            }
            n += 1;
        }
        if n == 0 {
            return Ok(());
        }
        let fresh = rep.group.take_fresh();
        let needed = self
            .parts
            .values()
            .filter_map(|p| p.engine().oldest_epoch_needed())
            .min();
        rep.group.fold(needed);
        let sealed = rep.group.group_sealed();
        let moved = sealed != rep.told;
        rep.told = sealed;
        if moved {
            self.holdings.set_reputation(rep.group.newest());
            self.metrics
                .reputation_table(sealed.map(|g| rep.group.params().start_of(g + 1) as f64 / 1e9));
        }
        let tps: Vec<Tp> = self.parts.keys().cloned().collect();
        for tp in tps {
            let part = self.parts.get_mut(&tp).ok_or_else(|| not_assigned(&tp))?;
            part.add_deltas(&fresh);
            if !moved {
                continue;
            }
            // Every partition learns it (a batch closing later must not
            // wait on an old value); one with waiting batches scores them
            // in this cycle.
            if part.pending_batches() > 0 {
                self.ensure_cycle()?;
            }
            let part = self.parts.get_mut(&tp).ok_or_else(|| not_assigned(&tp))?;
            part.set_group_sealed(sealed, &mut self.updates)?;
            if !self.updates.is_empty() {
                self.emit_updates(&tp, wall_clock())?;
            }
        }
        Ok(())
    }

    /// Emits into the open cycle what each partition sealed since the
    /// last cycle: its deltas, then its seal record (before the cycle's
    /// changelog records, so that they commit together).
    pub fn publish_reputation(&mut self) -> Result<()> {
        if self.reputation.is_none() {
            return Ok(());
        }
        let n = self.outputs.partitions(Route::Reputation);
        let tps: Vec<Tp> = self.parts.keys().cloned().collect();
        for tp in tps {
            let part = self.parts.get_mut(&tp).ok_or_else(|| not_assigned(&tp))?;
            let (deltas, sealed) = part.take_published();
            if let Some(e) = sealed {
                let at = self.cfg.engine().reputation.start_of(e + 1);
                self.metrics
                    .reputation_sealed(&format!("{}-{}", tp.0, tp.1), at as f64 / 1e9);
            }
            let partition = topic_partition(&tp, n);
            for r in records_of(&tp, deltas, sealed) {
                let (key, value) = r.encode();
                self.emit_at(&tp, Route::Reputation, Some(&key), value, Some(partition))?;
            }
        }
        Ok(())
    }
}
