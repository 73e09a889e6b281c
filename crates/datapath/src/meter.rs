//! OpenFlow meters of a bridge: token buckets that a rule's `meter:N` runs its packets
//! through before its other actions (OVS's userspace datapath, `dp_netdev_run_meter`).
//!
//! Semantics (as OVS's netdev datapath):
//! * Each band has a bucket: kbps meters count bits, pktps meters thousandths of a packet.
//!   Every millisecond adds `rate` to it (kbps × ms = bits, pktps × ms = 1/1000 packets),
//!   up to `burst_size × 1000` (kilobits, or packets); a band without a burst size gets
//!   `burst_size = rate` (one second's worth). A new (or reconfigured) meter starts with
//!   full buckets.
//! * A group of packets takes its volume from every band's bucket. A band whose bucket
//!   cannot pay for a packet is *exceeded* by it; each packet fires the exceeded band with
//!   the highest rate (at most one band per packet), whose counters count it, and a drop
//!   band drops it. (pktps: the first `bucket / 1000` packets pass, the rest exceed; kbps:
//!   packet by packet, by size.)
//! * Per meter: packets and bytes in; per band: packets and bytes it fired for.
//! * Only drop bands run here; the control plane refuses DSCP_REMARK as OVS's netdev
//!   datapath does (`OFPMMFC_BAD_BAND`).
//!
//! # Thread-safety
//! The table is shared by every PMD of the bridge's snapshot ([`MeterTable`] in
//! [`crate::flow::BridgeFlows`]). The id → meter map is an `ArcSwap` the control thread
//! replaces when a meter is added or deleted (a PMD's lookup is one atomic load, no lock).
//! Each [`Meter`]'s state is behind its **own mutex**, taken once per group of packets
//! (a burst's packets of one megaflow), never per packet and never for another meter:
//! there is no global lock on the packet path. A bucket's refill and drain must be one
//! step (two PMDs draining the same bucket must not both spend the same tokens), which a
//! per-meter lock gives simply and exactly; the critical section is a few dozen
//! instructions with no allocation or system call, so PMDs metering the same meter wait
//! for each other at most that long. It is taken blocking, not tried: a PMD that failed a
//! try-lock would have to pass its group unmetered or drop it. A reconfiguration
//! (`mod-meter`) swaps the state under that lock in place: the next group sees it, no
//! pipeline is rebuilt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use ferrovs_flow::meter::{MeterSpec, PKTPS};

/// Most bands per meter (OVS's netdev datapath: 8).
pub const MAX_BANDS: usize = 8;
/// Most meters per bridge (OVS's netdev datapath reports 262144).
pub const MAX_METERS: usize = 262_144;

/// Milliseconds since the first call (a monotonic clock for the buckets).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[derive(Debug, Clone, Copy, Default)]
struct Band {
    rate: u64,
    /// Bucket ceiling (bits or 1/1000 packets).
    max: u64,
    bucket: u64,
    packets: u64,
    bytes: u64,
}

#[derive(Debug)]
struct State {
    pktps: bool,
    bands: Vec<Band>,
    /// Clock of the last refill (ms).
    used: u64,
    /// Longest interval worth refilling: enough to fill every bucket.
    max_delta: u64,
}

/// One meter: its configuration's buckets and counters.
#[derive(Debug)]
pub struct Meter {
    state: Mutex<State>,
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
}

/// A meter's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeterCounters {
    pub packets: u64,
    pub bytes: u64,
    /// Per band (the configuration's order): packets and bytes it fired for.
    pub bands: Vec<(u64, u64)>,
}

fn state(spec: &MeterSpec, now: u64) -> State {
    let pktps = spec.flags & PKTPS != 0;
    let mut max_delta = 0;
    let bands = spec
        .bands
        .iter()
        .take(MAX_BANDS)
        .map(|b| {
            let rate = u64::from(b.rate.max(1));
            let burst = if b.burst_size == 0 {
                rate
            } else {
                u64::from(b.burst_size)
            };
            let max = burst * 1000;
            max_delta = max_delta.max(max / rate + 1);
            Band {
                rate,
                max,
                bucket: max,
                packets: 0,
                bytes: 0,
            }
        })
        .collect();
    State {
        pktps,
        bands,
        used: now,
        max_delta,
    }
}

impl Meter {
    /// A meter configured by `spec`, its buckets full at clock `now` (ms).
    pub fn new(spec: &MeterSpec, now: u64) -> Meter {
        Meter {
            state: Mutex::new(state(spec, now)),
            packets_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
        }
    }

    /// Reconfigures in place: full buckets, and every counter restarts (as OVS's datapath,
    /// which replaces the meter).
    pub fn reconfigure(&self, spec: &MeterSpec, now: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = state(spec, now);
        self.packets_in.store(0, Ordering::Relaxed);
        self.bytes_in.store(0, Ordering::Relaxed);
    }

    /// Runs packets of `sizes` bytes (at most 64) through the meter at clock `now` (ms);
    /// returns the mask of packets a band dropped (bit i: `sizes[i]`).
    pub fn run(&self, now: u64, sizes: &[u32]) -> u64 {
        let n = sizes.len().min(64);
        let sizes = &sizes[..n];
        if n == 0 {
            return 0;
        }
        let bytes: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
        self.packets_in.fetch_add(n as u64, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        // Per packet: the exceeded band with the highest rate (index + 1; 0: none).
        let mut fired = [0u8; 64];
        let mut fired_rate = [0u64; 64];
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A PMD that read the clock before another one refilled: no time passed for it.
        let delta = now.saturating_sub(s.used).min(s.max_delta);
        s.used = s.used.max(now);
        let pktps = s.pktps;
        let volume = if pktps { n as u64 * 1000 } else { bytes * 8 };
        for (bi, b) in s.bands.iter_mut().enumerate() {
            b.bucket = (b.bucket + delta * b.rate).min(b.max);
            if b.bucket >= volume {
                b.bucket -= volume;
                continue;
            }
            let mut exceed = |i: usize| {
                if b.rate > fired_rate[i] {
                    fired_rate[i] = b.rate;
                    fired[i] = bi as u8 + 1;
                }
            };
            if pktps {
                let pass = (b.bucket / 1000) as usize;
                b.bucket %= 1000;
                (pass..n).for_each(&mut exceed);
            } else {
                for (i, &sz) in sizes.iter().enumerate() {
                    let bits = u64::from(sz) * 8;
                    if b.bucket >= bits {
                        b.bucket -= bits;
                    } else {
                        exceed(i);
                    }
                }
            }
        }
        let mut dropped = 0u64;
        for i in 0..n {
            if fired[i] != 0 {
                let b = &mut s.bands[usize::from(fired[i] - 1)];
                b.packets += 1;
                b.bytes += u64::from(sizes[i]);
                dropped |= 1 << i;
            }
        }
        dropped
    }

    /// The meter's counters now.
    pub fn counters(&self) -> MeterCounters {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        MeterCounters {
            packets: self.packets_in.load(Ordering::Relaxed),
            bytes: self.bytes_in.load(Ordering::Relaxed),
            bands: s.bands.iter().map(|b| (b.packets, b.bytes)).collect(),
        }
    }

    /// Adds counters taken from another meter of the same configuration (a hot upgrade:
    /// the old daemon's counters at the freeze) to this one's. Bands pair by position; a
    /// band `c` has and this meter lacks (its configuration changed meanwhile) is left
    /// out, and a band this meter has beyond `c`'s keeps its own counts. The buckets are
    /// not touched: the new meter's start full, as after a `mod-meter`.
    pub fn restore(&self, c: &MeterCounters) {
        self.packets_in.fetch_add(c.packets, Ordering::Relaxed);
        self.bytes_in.fetch_add(c.bytes, Ordering::Relaxed);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for (b, &(packets, bytes)) in s.bands.iter_mut().zip(&c.bands) {
            b.packets = b.packets.saturating_add(packets);
            b.bytes = b.bytes.saturating_add(bytes);
        }
    }
}

/// A bridge's meters by OpenFlow id.
#[derive(Debug, Default)]
pub struct MeterTable {
    map: ArcSwap<HashMap<u32, Arc<Meter>>>,
}

impl MeterTable {
    /// The meter `id`, if it exists (one atomic load and a hash lookup).
    #[inline]
    pub fn get(&self, id: u32) -> Option<Arc<Meter>> {
        self.map.load().get(&id).cloned()
    }

    /// Adds meter `spec.id`, or reconfigures it in place if it exists (control thread).
    pub fn set(&self, spec: &MeterSpec) {
        let now = now_ms();
        if let Some(m) = self.get(spec.id) {
            m.reconfigure(spec, now);
            return;
        }
        let mut map = HashMap::clone(&self.map.load());
        map.insert(spec.id, Arc::new(Meter::new(spec, now)));
        self.map.store(Arc::new(map));
    }

    /// Removes meter `id` (control thread).
    pub fn remove(&self, id: u32) {
        let mut map = HashMap::clone(&self.map.load());
        if map.remove(&id).is_some() {
            self.map.store(Arc::new(map));
        }
    }

    /// The ids of every meter.
    pub fn ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.map.load().keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_flow::meter::parse_meter;

    fn meter(text: &str) -> Meter {
        Meter::new(&parse_meter(text).unwrap(), 0)
    }

    /// Packets of `size` bytes at `pps` for `secs` seconds, in bursts of `burst` every
    /// `burst / pps` seconds (integer milliseconds); how many passed.
    fn offer(m: &Meter, start: u64, secs: u64, pps: u64, burst: usize, size: u32) -> u64 {
        let per_ms = pps as f64 / 1000.0;
        let (mut passed, mut owed) = (0u64, 0.0f64);
        for ms in 0..secs * 1000 {
            owed += per_ms;
            while owed >= burst as f64 {
                owed -= burst as f64;
                let sizes = vec![size; burst];
                let d = m.run(start + ms, &sizes);
                passed += burst as u64 - u64::from(d.count_ones());
            }
        }
        passed
    }

    #[test]
    fn restored_counters_add_to_the_new_meters_band_by_band() {
        let m = meter("meter=1,kbps,bands=type=drop,rate=100 type=drop,rate=500");
        m.run(1, &[100, 200]);
        let before = m.counters();
        m.restore(&MeterCounters {
            packets: 10,
            bytes: 1000,
            // A third band the meter does not have (any more) is left out.
            bands: vec![(1, 64), (2, 128), (9, 9)],
        });
        let c = m.counters();
        assert_eq!(c.packets, before.packets + 10);
        assert_eq!(c.bytes, before.bytes + 1000);
        assert_eq!(c.bands.len(), 2);
        assert_eq!(c.bands[0], (before.bands[0].0 + 1, before.bands[0].1 + 64));
        assert_eq!(c.bands[1], (before.bands[1].0 + 2, before.bands[1].1 + 128));
        // Fewer bands than the meter has: the others keep their counts.
        m.restore(&MeterCounters {
            packets: 0,
            bytes: 0,
            bands: vec![(1, 1)],
        });
        assert_eq!(m.counters().bands[1], c.bands[1]);
    }

    #[test]
    fn pktps_meter_passes_its_rate_plus_its_burst() {
        // 1000 pps offered, 100 pps allowed, default burst (= rate: 100 packets).
        let m = meter("meter=1,pktps,band=type=drop,rate=100");
        let passed = offer(&m, 1, 10, 1000, 10, 64);
        // 10 s × 100 pps + the initial bucket of 100, within one burst of 10.
        assert!((1090..=1110).contains(&passed), "{passed}");
        let c = m.counters();
        assert_eq!(c.packets, 10_000);
        assert_eq!(c.bytes, 640_000);
        assert_eq!(c.bands[0].0, 10_000 - passed);
        assert_eq!(c.bands[0].1, (10_000 - passed) * 64);
    }

    #[test]
    fn kbps_meter_passes_its_rate_in_bits() {
        // 1000-byte packets (8 kbit) at 1000 pps = 8000 kbps offered, 800 kbps allowed.
        let m = meter("meter=1,kbps,burst,band=type=drop,rate=800,burst_size=80");
        let passed = offer(&m, 1, 10, 1000, 1, 1000);
        // 800 kbps × 10 s / 8 kbit = 1000 packets, plus the 80-kbit burst (10 packets).
        assert!((1005..=1012).contains(&passed), "{passed}");
    }

    #[test]
    fn traffic_below_the_rate_is_never_dropped() {
        let m = meter("meter=1,pktps,band=type=drop,rate=1000");
        assert_eq!(offer(&m, 1, 5, 900, 9, 100), 4500);
        let m = meter("meter=1,kbps,band=type=drop,rate=1000");
        // 100-byte packets at 1000 pps = 800 kbps.
        assert_eq!(offer(&m, 1, 5, 1000, 4, 100), 5000);
    }

    #[test]
    fn burst_is_what_passes_at_once_after_idle() {
        let m = meter("meter=1,pktps,burst,band=type=drop,rate=10,burst_size=50");
        // A full bucket: 50 packets in one instant, then nothing.
        let d = m.run(1, &[64; 60]);
        assert_eq!(d.count_ones(), 10);
        assert_eq!(d, ((1u64 << 60) - 1) & !((1 << 50) - 1));
        // 1 s idle refills 10 packets' worth.
        let d = m.run(1001, &[64; 20]);
        assert_eq!(d.count_ones(), 10);
        // A long idle refills only up to the burst.
        let d = m.run(100_000, &[64; 60]);
        assert_eq!(d.count_ones(), 10);
        // Time going backwards (another PMD refilled later) adds nothing.
        let d = m.run(99_000, &[64; 1]);
        assert_eq!(d.count_ones(), 1);
    }

    #[test]
    fn the_highest_rate_exceeded_band_fires() {
        // Bands at 10 and 20 pps, buckets of 10 and 20 packets.
        let m = meter("meter=1,pktps,bands=type=drop,rate=10 type=drop,rate=20");
        let d = m.run(1, &[64; 30]);
        // Packets 0-9 pass both; 10-19 exceed band 0 only; 20-29 exceed both: band 1
        // (the higher rate) fires for them. All exceeding packets are dropped.
        assert_eq!(d.count_ones(), 20);
        let c = m.counters();
        assert_eq!(c.bands, vec![(10, 640), (10, 640)]);
    }

    #[test]
    fn reconfiguring_refills_and_changes_the_rate() {
        let table = MeterTable::default();
        let spec = parse_meter("meter=7,pktps,band=type=drop,rate=5").unwrap();
        table.set(&spec);
        let m = table.get(7).unwrap();
        let now = now_ms();
        assert_eq!(m.run(now, &[64; 10]).count_ones(), 5);
        table.set(&parse_meter("meter=7,pktps,band=type=drop,rate=8").unwrap());
        // The same meter (rules keep it), new buckets.
        assert!(Arc::ptr_eq(&m, &table.get(7).unwrap()));
        assert_eq!(m.run(now, &[64; 10]).count_ones(), 2);
        assert_eq!(m.counters().packets, 10);
        assert_eq!(table.ids(), vec![7]);
        table.remove(7);
        assert!(table.get(7).is_none());
    }
}
