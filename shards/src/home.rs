//! An object's home: the shard it lives on, the same for every node of the same shard count
//! (a leaf: the app interface, the alarm index and the cells all ask it).

/// The shard an object lives on: FNV-1a of `app/name`, modulo the shard count. Stable across
/// restarts and builds.
pub fn home_shard(app: &str, name: &str, shards: usize) -> usize {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in app.bytes().chain(std::iter::once(b'/')).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % shards.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_shard_is_stable_and_spread() {
        assert_eq!(home_shard("counter", "a", 1), 0);
        let a = home_shard("counter", "a", 4);
        assert_eq!(a, home_shard("counter", "a", 4));
        let mut seen = [0usize; 4];
        for i in 0..400 {
            seen[home_shard("million", &format!("b{i}"), 4)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }
}
