//! What the query API and `inspect` read of one inference or one rubric:
//! bounded prefix scans and point lookups, never a write.

use super::*;

impl Store {
    /// One reviewer's numbers per rubric (the rubrics are the partition's
    /// agreement rows: one point lookup each).
    pub fn reviewer(&self, voter_id: &str) -> Result<Vec<(String, ReviewerStats)>, StoreError> {
        let rubrics: Vec<String> = self.agreement()?.into_iter().map(|(r, _)| r).collect();
        let keys: Vec<Vec<u8>> = rubrics.iter().map(|r| reviewer_key(r, voter_id)).collect();
        let mut out = Vec::new();
        self.multi_get(&keys, |i, v| {
            if let Some(v) = v {
                let stats = self.decoded(&keys[i], v, format::decode_reviewer)?;
                out.push((rubrics[i].clone(), stats));
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Every reviewer of one rubric (one prefix scan), in voter id byte
    /// order.
    pub fn reviewers_of(&self, rubric: &str) -> Result<Vec<(String, ReviewerStats)>, StoreError> {
        let prefix = reviewer_prefix(rubric);
        let mut out = Vec::new();
        for item in self.prefix(&prefix) {
            let (k, v) = item?;
            let voter = std::str::from_utf8(&k[prefix.len()..]).map_err(|e| self.corrupt(&k, e))?;
            let stats = self.decoded(&k, &v, format::decode_reviewer)?;
            out.push((voter.to_owned(), stats));
        }
        Ok(out)
    }

    /// The voters of every series of `inference_id`, per `voter_prompt_id`:
    /// the first `limit` voter ids in byte order, and whether there are
    /// more. One scan of the inference's `v` keys (a series over the limit
    /// is skipped with a seek).
    pub fn voters_of(
        &self,
        inference_id: &str,
        limit: usize,
    ) -> Result<HashMap<String, (Vec<String>, bool)>, StoreError> {
        let prefix = [&b"v"[..], &series_prefix(inference_id)[1..]].concat();
        let mut opts = ReadOptions::default();
        opts.set_prefix_same_as_start(true);
        if let Some(end) = prefix_end(&prefix) {
            opts.set_iterate_upper_bound(end);
        }
        let mut it = self.db.raw_iterator_opt(opts);
        it.seek(&prefix);
        let mut out: HashMap<String, (Vec<String>, bool)> = HashMap::new();
        while let Some(key) = it.key() {
            if !key.starts_with(&prefix) {
                break;
            }
            let rest = &key[prefix.len()..];
            let parsed = rest.get(..4).and_then(|l| {
                let n = u32::from_be_bytes(l.try_into().ok()?) as usize;
                let vp = std::str::from_utf8(rest.get(4..4 + n)?).ok()?;
                let voter = std::str::from_utf8(&rest[4 + n..]).ok()?;
                Some((4 + n, vp, voter))
            });
            let Some((series_len, vp, voter)) = parsed else {
                return Err(self.corrupt(key, "bad voter key"));
            };
            let entry = out.entry(vp.to_owned()).or_default();
            if entry.0.len() == limit {
                entry.1 = true;
                // Past this series' voters.
                match prefix_end(&key[..prefix.len() + series_len]) {
                    Some(next) => it.seek(next),
                    None => break,
                }
                continue;
            }
            entry.0.push(voter.to_owned());
            it.next();
        }
        it.status().map_err(|e| self.rocks(e))?;
        Ok(out)
    }

    /// Every stored series of one inference, in voter_prompt_id order.
    pub fn series_of(
        &self,
        inference_id: &str,
    ) -> Result<Vec<(SeriesKey, SeriesState)>, StoreError> {
        let prefix = series_prefix(inference_id);
        let mut out = Vec::new();
        for item in self.inference_scan(&prefix) {
            let (k, v) = item?;
            let key = parse_series_key(&k).ok_or_else(|| self.corrupt(&k, "bad series key"))?;
            if &*key.inference_id != inference_id {
                continue;
            }
            let s = self.decoded(&k, &v, format::decode_series)?;
            out.push((key, s));
        }
        Ok(out)
    }

    /// The open batches of one inference (for `inspect`).
    pub fn batches_of(&self, inference_id: &str) -> Result<Vec<(BatchKey, Batch)>, StoreError> {
        let mut out = Vec::new();
        for item in self.prefix(b"b") {
            let (k, v) = item?;
            let key = format::parse_batch_key(&k[1..]).map_err(|e| self.corrupt(&k, e))?;
            if &*key.series.inference_id == inference_id {
                let b = self.decoded(&k, &v, format::decode_batch)?;
                out.push((key, b));
            }
        }
        Ok(out)
    }
}
