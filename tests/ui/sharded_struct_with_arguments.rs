use safemlx_dist::{sharded, Sharded, ShardedArray};

#[sharded(mesh = mesh)]
struct Layer {
    #[shard(Sharded<1>)]
    up: ShardedArray<Sharded<1>>,
}

fn main() {}
