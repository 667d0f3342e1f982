// Only a whole (replicated) array can become one term of a sum over
// another axis; column shards must be gathered over their axis first.
use safemlx_dist::typed::{Axis, Dp, Tp};
use safemlx_dist::{Sharded, ShardedArray};

fn replicas(x: &ShardedArray<Sharded<1>, Axis<Tp, 2>>, dp: &Axis<Dp, 2>) {
    let _ = x.partial_over(dp);
}

fn main() {}
