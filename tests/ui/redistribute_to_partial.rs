use safemlx::Stream;
use safemlx_dist::{Partial, Replicated, ShardedArray};

fn make_partial(x: ShardedArray<Replicated>, s: &Stream) {
    let _ = x.redistribute::<Partial>(s);
}

fn main() {}
