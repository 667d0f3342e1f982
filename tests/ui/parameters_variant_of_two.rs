use safemlx_dist::grad::Parameters;
use safemlx_dist::nn::{Mlp, RmsNorm};

#[derive(Parameters)]
enum FeedForward {
    Dense(Mlp),
    Normed(RmsNorm, Mlp),
}

fn main() {}
