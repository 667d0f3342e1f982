use safemlx_dist::{sharded, Partial, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Partial)]
    w: ShardedArray<Partial>,
}

fn main() {}
