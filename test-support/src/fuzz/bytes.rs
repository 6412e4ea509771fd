//! Reading fuzz input as a stream of choices that never fails (an exhausted input reads as
//! zeros), and the deterministic inputs the fixed-seed tests run.

/// A cursor over fuzz input: every read succeeds.
pub struct ByteReader<'a> {
    data: &'a [u8],
}

impl<'a> ByteReader<'a> {
    /// Reads `data` from its start.
    pub fn new(data: &'a [u8]) -> Self {
        ByteReader { data }
    }

    /// Whether everything has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte (0 once exhausted).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u32) -> u32 {
        if n <= 256 {
            u32::from(self.u8()) % n
        } else {
            self.u32() % n
        }
    }

    /// True with probability about `percent`/100.
    pub fn chance(&mut self, percent: u8) -> bool {
        self.u8() % 100 < percent
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u32) as usize]
    }

    /// Up to `max` bytes.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = (self.u16() as usize % (max + 1)).min(self.data.len());
        let (head, rest) = self.data.split_at(len);
        self.data = rest;
        head.to_vec()
    }
}

/// `count` inputs of up to `max_len` bytes from a xorshift generator seeded with `seed`: the
/// same inputs on every run, so a failure reproduces (the index of the input is the
/// reproducer, and the bytes can be written to a file for the fuzz target).
pub fn fixed_seed_inputs(seed: u64, count: usize, max_len: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count).map(move |_| {
        let len = (next() % (max_len as u64 + 1)) as usize;
        (0..len).map(|_| next() as u8).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exhausted_reader_reads_zeros() {
        let mut r = ByteReader::new(&[1, 2]);
        assert_eq!(r.u16(), 0x0201);
        assert!(r.is_empty());
        assert_eq!((r.u8(), r.u32(), r.u64(), r.below(7)), (0, 0, 0, 0));
        assert!(r.bytes(10).is_empty());
    }

    #[test]
    fn fixed_seed_inputs_repeat() {
        let a: Vec<_> = fixed_seed_inputs(7, 5, 64).collect();
        let b: Vec<_> = fixed_seed_inputs(7, 5, 64).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|i| i.len() <= 64));
    }
}
