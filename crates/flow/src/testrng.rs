//! A small seeded PRNG for the randomized tests (xorshift64*).

use crate::key::Field;

#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn next128(&mut self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A value for `f` from a small range, so random keys and rules collide often.
    pub fn small_value(&mut self, f: Field) -> u128 {
        let v = match f {
            Field::EthType => [0x0800, 0x86dd, 0x0806][self.below(3) as usize],
            Field::IpProto => [1, 6, 17][self.below(3) as usize],
            Field::Ipv4Src | Field::Ipv4Dst => {
                u128::from(0x0a00_0000u32 | (self.below(4) << 8) as u32 | self.below(4) as u32)
            }
            _ => u128::from(self.below(4)),
        };
        v & f.full()
    }
}
