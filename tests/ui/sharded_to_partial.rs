use safemlx::Stream;
use safemlx_dist::{Partial, Sharded, ShardedArray};

fn back_to_partial(x: ShardedArray<Sharded<0>>, s: &Stream) {
    let _ = x.redistribute::<Partial>(s);
}

fn main() {}
