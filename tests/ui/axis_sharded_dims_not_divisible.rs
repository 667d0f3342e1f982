// A layer's weights placed over the tensor-parallel axis of 4 ranks: a
// declared dimension that 4 does not divide is reported where it is
// written, as for a `Mesh<4>`.
use safemlx_dist::typed::{Axis, Tp};
use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded<1>, dims = [4096, 11006])]
    up: ShardedArray<Sharded<1>, Axis<Tp, 4>>,
}

fn main() {}
