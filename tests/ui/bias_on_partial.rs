use safemlx::Stream;
use safemlx_dist::{Partial, Replicated, Sharded, ShardedArray};

// A bias added to a partial sum would be added once per rank.
fn biased(y: &ShardedArray<Partial>, b: &ShardedArray<Sharded<0>>, s: &Stream) {
    let _ = y.add_bias(b, s);
}

// Column-parallel outputs take their own columns of the bias, not all of it.
fn whole_bias(y: &ShardedArray<Sharded<1>>, b: &ShardedArray<Replicated>, s: &Stream) {
    let _ = y.add_bias(b, s);
}

fn main() {}
