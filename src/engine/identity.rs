//! Vote identities (contract §4): the 128-bit hash a duplicate is recognised
//! by, and the derived `vote_id` of a vote that has none.

use crate::input::Vote;

/// The stable id of a vote without `vote_id`.
pub fn derived_vote_id(v: &Vote) -> String {
    format!("derived:{:032x}", tuple_identity(v))
}

fn hash_parts(tag: u8, parts: &[&[u8]]) -> u128 {
    // Room for the usual ids (zeroing a larger buffer on every call was a
    // measurable part of the replay); longer ones take the streaming form.
    let mut buf = [0u8; 320];
    let need = 1 + parts.iter().map(|p| 4 + p.len()).sum::<usize>();
    if need > buf.len() {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&[tag]);
        for p in parts {
            h.update(&(p.len() as u32).to_le_bytes());
            h.update(p);
        }
        return h.digest128();
    }
    // The same bytes as the streaming form above, without an allocation.
    buf[0] = tag;
    let mut at = 1;
    for p in parts {
        buf[at..at + 4].copy_from_slice(&(p.len() as u32).to_le_bytes());
        at += 4;
        buf[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    xxhash_rust::xxh3::xxh3_128(&buf[..at])
}

fn tuple_identity(v: &Vote) -> u128 {
    hash_parts(
        2,
        &[
            v.inference_id.as_bytes(),
            v.voter_id.as_bytes(),
            v.voter_prompt_id.as_bytes(),
            &v.timestamp.to_le_bytes(),
        ],
    )
}

/// The identity of contract §4: series plus `vote_id`, or the tuple. The two
/// kinds are tagged apart so they never match each other.
pub fn vote_identity(v: &Vote) -> u128 {
    match &v.vote_id {
        Some(id) => hash_parts(
            1,
            &[
                v.inference_id.as_bytes(),
                v.voter_prompt_id.as_bytes(),
                id.as_bytes(),
            ],
        ),
        None => tuple_identity(v),
    }
}
