use safemlx_dist::{sharded, Mesh, Sharded, ShardedArray};

#[sharded]
struct Layer {
    #[shard(Sharded<1>, dims = [4096])]
    up: ShardedArray<Sharded<1>, Mesh<4>>,
}

fn main() {}
