//! A program's bytes, as the world and the programs read them.

/// The fuzzer's bytes, read front to back; reads past the end give zeros.
pub(super) struct Input<'a>(pub(super) &'a [u8]);

impl Input<'_> {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub(super) fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub(super) fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub(super) fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub(super) fn bytes(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
    /// One of `n` choices.
    pub(super) fn pick(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }
}
