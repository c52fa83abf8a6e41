//! Pointwise activations.

/// GELU, exact form `x/2 · (1 + erf(x/√2))` (PyTorch's default, not the tanh approximation).
pub fn gelu_in_place(x: &mut [f32]) {
    use rayon::prelude::*;
    // MLP hidden layers are millions of values per block: worth splitting across threads.
    x.par_chunks_mut(16 * 1024).for_each(|chunk| {
        for v in chunk {
            let t = *v as f64;
            *v = (0.5 * t * (1.0 + erf(t * std::f64::consts::FRAC_1_SQRT_2))) as f32;
        }
    });
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn relu_in_place(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

/// Error function in f64 (W. J. Cody's rational approximations, as in most libms), accurate far
/// beyond what an f32 GELU needs.
pub fn erf(x: f64) -> f64 {
    libm_erf(x)
}

// The published coefficients are kept digit for digit, beyond what f64 stores.
#[allow(clippy::excessive_precision)]
fn libm_erf(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 0.5 {
        // erf(x) = x · P(x²)/Q(x²)
        const P: [f64; 5] = [
            3.209_377_589_138_469_4e3,
            3.774_852_376_853_020_2e2,
            1.138_641_541_510_501_6e2,
            3.161_123_743_870_565_6,
            1.857_777_061_846_031_5e-1,
        ];
        const Q: [f64; 5] = [
            2.844_236_833_439_170_6e3,
            1.282_616_526_077_372_3e3,
            2.440_246_379_344_441_7e2,
            2.360_129_095_234_412_1e1,
            1.0,
        ];
        let z = x * x;
        let num = P[0] + z * (P[1] + z * (P[2] + z * (P[3] + z * P[4])));
        let den = Q[0] + z * (Q[1] + z * (Q[2] + z * (Q[3] + z * Q[4])));
        return x * num / den;
    } else if ax < 4.0 {
        const P: [f64; 9] = [
            1.230_339_354_797_997_2e3,
            2.051_078_377_826_071_5e3,
            1.712_047_612_634_070_6e3,
            8.819_522_212_417_690_9e2,
            2.986_351_381_974_001_3e2,
            6.611_919_063_714_163e1,
            8.883_149_794_388_376,
            5.641_884_969_886_701e-1,
            2.153_115_354_744_038_5e-8,
        ];
        const Q: [f64; 9] = [
            1.230_339_354_803_749_4e3,
            3.439_367_674_143_721_6e3,
            4.362_619_090_143_247e3,
            3.290_799_235_733_459_7e3,
            1.621_389_574_566_690_2e3,
            5.371_811_018_620_098_6e2,
            1.176_939_508_913_125e2,
            1.574_492_611_070_983_5e1,
            1.0,
        ];
        let mut num = P[8];
        let mut den = Q[8];
        for i in (0..8).rev() {
            num = num * ax + P[i];
            den = den * ax + Q[i];
        }
        let erfc = (-ax * ax).exp() * num / den;
        1.0 - erfc
    } else {
        const P: [f64; 6] = [
            -6.587_491_615_298_378e-4,
            -1.608_378_514_874_227_5e-2,
            -1.257_817_261_112_292_5e-1,
            -3.603_448_999_498_044_5e-1,
            -3.053_266_349_612_323_4e-1,
            -1.631_538_713_730_709_6e-2,
        ];
        const Q: [f64; 6] = [
            2.335_204_976_268_691_8e-3,
            6.051_834_131_244_132e-2,
            5.279_051_029_514_284e-1,
            1.872_952_849_923_460_4,
            2.568_520_192_289_822,
            1.0,
        ];
        let z = 1.0 / (ax * ax);
        let mut num = P[5];
        let mut den = Q[5];
        for i in (0..5).rev() {
            num = num * z + P[i];
            den = den * z + Q[i];
        }
        let frac_1_sqrt_pi = 0.564_189_583_547_756_3;
        let erfc = (-ax * ax).exp() / ax * (frac_1_sqrt_pi + z * num / den);
        1.0 - erfc
    };
    if x < 0.0 { -r } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_known_values() {
        // Reference values of erf.
        let cases = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
            (5.0, 0.999_999_999_998_462_5),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-12);
        }
    }
}
