use safemlx_dist::{Partial, QuantizedArray};

fn layer(_w: &QuantizedArray<Partial>) {}

fn main() {}
