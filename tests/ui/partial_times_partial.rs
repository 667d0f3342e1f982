use safemlx::Stream;
use safemlx_dist::{Partial, ShardedArray};

fn product(a: &ShardedArray<Partial>, b: &ShardedArray<Partial>, s: &Stream) {
    let _ = a.mul(b, s);
}

fn main() {}
