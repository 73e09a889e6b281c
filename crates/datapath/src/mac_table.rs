//! A lock-free MAC learning table.
//!
//! Every PMD learns and looks up concurrently; there is no lock. The table is a fixed array
//! of 4-way buckets of two `AtomicU64`s: `key` = valid bit | VLAN | MAC, `val` = a 16-bit tag
//! of the key | port | last-seen second. A reader accepts an entry only if the key matches and
//! the tag in `val` matches the key, so a writer replacing an entry concurrently can at worst
//! make one lookup miss (the packet is flooded), never send it to another MAC's port.
//! Entries older than the aging time are misses and are reused first.
//!
//! Learning writes only when something changed (new MAC, moved MAC, or the last-seen second
//! is a second old), so steady traffic does not bounce cache lines between PMDs.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ferrovs_packet::Mac;

const WAYS: usize = 4;
const VALID: u64 = 1 << 63;

#[derive(Debug, Default)]
struct Entry {
    key: AtomicU64,
    val: AtomicU64,
}

/// The MAC table of one bridge.
#[derive(Debug)]
pub struct MacTable {
    entries: Box<[Entry]>,
    mask: usize,
    aging: AtomicU32,
    pub learned: AtomicU64,
    pub moved: AtomicU64,
    pub evicted: AtomicU64,
}

/// A learned address, for `ferrovs mac-table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacEntry {
    pub mac: Mac,
    pub vlan: u16,
    pub port: u32,
    pub age: u32,
}

#[inline]
fn key_of(mac: Mac, vlan: u16) -> u64 {
    VALID | (u64::from(vlan & 0xfff) << 48) | (mac & 0xffff_ffff_ffff)
}

#[inline]
fn hash(key: u64) -> u64 {
    let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

#[inline]
fn tag(key: u64) -> u64 {
    (hash(key) >> 48) & 0xffff
}

#[inline]
fn pack(key: u64, port: u32, now: u32) -> u64 {
    (tag(key) << 48) | (u64::from(port & 0xffff) << 32) | u64::from(now)
}

impl MacTable {
    /// A table of at least `capacity` entries, aging entries after `aging_secs`.
    pub fn new(capacity: usize, aging_secs: u32) -> MacTable {
        let n = capacity.next_power_of_two().max(WAYS);
        MacTable {
            entries: (0..n).map(|_| Entry::default()).collect(),
            mask: (n / WAYS) - 1,
            aging: AtomicU32::new(aging_secs),
            learned: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    pub fn set_aging(&self, secs: u32) {
        self.aging.store(secs, Ordering::Relaxed);
    }

    pub fn aging(&self) -> u32 {
        self.aging.load(Ordering::Relaxed)
    }

    #[inline]
    fn bucket(&self, key: u64) -> &[Entry] {
        let b = (hash(key) as usize) & self.mask;
        &self.entries[b * WAYS..b * WAYS + WAYS]
    }

    #[inline]
    fn fresh(&self, val: u64, now: u32) -> bool {
        now.wrapping_sub(val as u32) <= self.aging.load(Ordering::Relaxed)
    }

    /// The port `mac` was last seen on in `vlan`, if fresh. `now` is in seconds.
    #[inline]
    pub fn lookup(&self, mac: Mac, vlan: u16, now: u32) -> Option<u32> {
        let key = key_of(mac, vlan);
        for e in self.bucket(key) {
            if e.key.load(Ordering::Acquire) == key {
                let v = e.val.load(Ordering::Acquire);
                if v >> 48 == tag(key) && self.fresh(v, now) {
                    return Some(((v >> 32) & 0xffff) as u32);
                }
            }
        }
        None
    }

    /// Records that `mac` was seen on `port` in `vlan`.
    #[inline]
    pub fn learn(&self, mac: Mac, vlan: u16, port: u32, now: u32) {
        let key = key_of(mac, vlan);
        let bucket = self.bucket(key);
        for e in bucket {
            if e.key.load(Ordering::Acquire) == key {
                let v = e.val.load(Ordering::Relaxed);
                let same_port = ((v >> 32) & 0xffff) as u32 == port;
                if !same_port {
                    self.moved.fetch_add(1, Ordering::Relaxed);
                }
                if !same_port || v as u32 != now {
                    e.val.store(pack(key, port, now), Ordering::Release);
                }
                return;
            }
        }
        // New address: take an empty or stale way, else the oldest.
        let mut victim = &bucket[0];
        let mut oldest = u32::MAX;
        for e in bucket {
            let k = e.key.load(Ordering::Relaxed);
            let v = e.val.load(Ordering::Relaxed);
            if k & VALID == 0 || !self.fresh(v, now) {
                victim = e;
                oldest = 0;
                break;
            }
            let age_key = u32::MAX - now.wrapping_sub(v as u32);
            if age_key < oldest {
                oldest = age_key;
                victim = e;
            }
        }
        if oldest != 0 && victim.key.load(Ordering::Relaxed) & VALID != 0 {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        victim.val.store(pack(key, port, now), Ordering::Release);
        victim.key.store(key, Ordering::Release);
        self.learned.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets every address learned on `port` (port deleted or moved).
    pub fn flush_port(&self, port: u32) {
        for e in self.entries.iter() {
            let v = e.val.load(Ordering::Relaxed);
            if ((v >> 32) & 0xffff) as u32 == port {
                e.key.store(0, Ordering::Release);
            }
        }
    }

    /// Forgets everything.
    pub fn flush(&self) {
        for e in self.entries.iter() {
            e.key.store(0, Ordering::Release);
        }
    }

    /// The fresh entries.
    pub fn dump(&self, now: u32) -> Vec<MacEntry> {
        let mut v = Vec::new();
        for e in self.entries.iter() {
            let k = e.key.load(Ordering::Acquire);
            let val = e.val.load(Ordering::Acquire);
            if k & VALID != 0 && val >> 48 == tag(k) && self.fresh(val, now) {
                v.push(MacEntry {
                    mac: k & 0xffff_ffff_ffff,
                    vlan: ((k >> 48) & 0xfff) as u16,
                    port: ((val >> 32) & 0xffff) as u32,
                    age: now.wrapping_sub(val as u32),
                });
            }
        }
        v.sort_by_key(|e| (e.vlan, e.mac));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_moves_and_ages() {
        let t = MacTable::new(64, 300);
        assert_eq!(t.lookup(0xa, 0, 0), None);
        t.learn(0xa, 0, 1, 0);
        assert_eq!(t.lookup(0xa, 0, 10), Some(1));
        assert_eq!(t.lookup(0xa, 5, 10), None, "VLANs are separate");
        t.learn(0xa, 0, 2, 20);
        assert_eq!(t.lookup(0xa, 0, 20), Some(2));
        assert_eq!(t.moved.load(Ordering::Relaxed), 1);
        assert_eq!(t.lookup(0xa, 0, 321), None, "aged out");
        t.learn(0xb, 0, 3, 400);
        t.flush_port(3);
        assert_eq!(t.lookup(0xb, 0, 400), None);
    }

    #[test]
    fn full_bucket_evicts_oldest_and_never_misdirects() {
        let t = MacTable::new(4, 300); // a single bucket of 4 ways
        for m in 0..4u64 {
            t.learn(m, 0, m as u32, m as u32);
        }
        t.learn(100, 0, 100, 10);
        assert_eq!(t.lookup(0, 0, 10), None, "oldest evicted");
        for m in 1..4u64 {
            assert_eq!(t.lookup(m, 0, 10), Some(m as u32));
        }
        assert_eq!(t.lookup(100, 0, 10), Some(100));
        assert_eq!(t.dump(10).len(), 4);
    }

    #[test]
    fn concurrent_learning_never_misdirects() {
        let t = std::sync::Arc::new(MacTable::new(8, 300));
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 0..200_000u64 {
                        let mac = (i % 64) + 1;
                        t.learn(mac, 0, (mac as u32) * 10 + w, 1);
                    }
                })
            })
            .collect();
        for _ in 0..200_000u64 {
            for mac in 1..64u64 {
                if let Some(p) = t.lookup(mac, 0, 1) {
                    assert_eq!(p / 10, mac as u32, "entry of another MAC returned");
                }
            }
        }
        for w in writers {
            w.join().unwrap();
        }
    }
}
