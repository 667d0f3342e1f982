// Column shards over the tensor-parallel axis are gathered over that axis,
// not over the pipeline's.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Pp, Tp};
use safemlx_dist::{Replicated, Sharded, ShardedArray};

fn gather(x: ShardedArray<Sharded<1>, Axis<Tp, 2>>, s: &Stream) {
    let _ = x.redistribute_over::<Pp, Replicated>(s);
}

fn main() {}
