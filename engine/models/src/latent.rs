//! [`LatentFormat`]: a family's latent space (ComfyUI's `latent_formats`): how many channels, how far the VAE
//! downscales, the map between the VAE's space (what LATENT links carry) and the diffusion model's (one scale
//! and shift, or a mean and standard deviation per channel), and the linear map to RGB that latent previews
//! use.

/// A family's latent space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentFormat {
    /// Latent channels.
    pub channels: usize,
    /// Pixels per latent along each image axis (8 for the Flux VAE).
    pub spatial_downscale: usize,
    /// Frames per latent frame along time (1 for image families).
    pub temporal_downscale: usize,
    /// VAE space → model space.
    pub normalize: Normalize,
    /// The linear map of a (model-space) latent to RGB in [-1, 1] for previews: per-channel rows and a bias.
    pub rgb: Option<(&'static [[f32; 3]], [f32; 3])>,
}

impl LatentFormat {
    /// The Flux VAE's latent space (Flux.1's and Z-Image's): 16 channels, 8× down, scale 0.3611, shift 0.1159.
    pub const FLUX: LatentFormat = LatentFormat {
        channels: 16,
        spatial_downscale: 8,
        temporal_downscale: 1,
        normalize: Normalize::Affine { scale: 0.3611, shift: 0.1159 },
        rgb: Some((&FLUX_RGB.0, FLUX_RGB.1)),
    };

    /// The FLUX.2 VAE's latent space (ComfyUI's `Flux2`): 128 channels (32 patchified 2×2), 16× down, already
    /// normalised by the VAE, so the map to the model's space is the identity. Previews average each 2×2
    /// patch: ComfyUI's 32 rows, each a quarter, for the patch's 4 channels (ComfyUI unpatchifies first and
    /// shows twice the resolution; the colours are the same up to that averaging).
    pub const FLUX2: LatentFormat = LatentFormat {
        channels: 128,
        spatial_downscale: 16,
        temporal_downscale: 1,
        normalize: Normalize::Identity,
        rgb: Some((&FLUX2_RGB_PATCHES, FLUX_RGB.1)),
    };

    /// SD 1.x's KL autoencoder's latent space (ComfyUI's `SD15`; Lotus and SD 2 use it too): 4 channels, 8×
    /// down, scale 0.18215, no shift.
    pub const SD15: LatentFormat = LatentFormat {
        channels: 4,
        spatial_downscale: 8,
        temporal_downscale: 1,
        normalize: Normalize::Affine { scale: 0.18215, shift: 0.0 },
        rgb: Some((&SD15_RGB, [0.0; 3])),
    };

    /// SDXL's latent space (ComfyUI's `SDXL`): SD's autoencoder's 4 channels, 8× down, scale 0.13025, no shift.
    pub const SDXL: LatentFormat = LatentFormat {
        channels: 4,
        spatial_downscale: 8,
        temporal_downscale: 1,
        normalize: Normalize::Affine { scale: 0.13025, shift: 0.0 },
        rgb: Some((&SDXL_RGB, SDXL_RGB_BIAS)),
    };

    /// SD3's VAE's latent space (ComfyUI's `SD3`): 16 channels, 8× down, scale 1.5305, shift 0.0609.
    pub const SD3: LatentFormat = LatentFormat {
        channels: 16,
        spatial_downscale: 8,
        temporal_downscale: 1,
        normalize: Normalize::Affine { scale: 1.5305, shift: 0.0609 },
        rgb: Some((&SD3_RGB, [0.2394, 0.2135, 0.1925])),
    };

    /// The Wan 2.1 VAE's latent space (Wan 2.1 and 2.2 A14B, Qwen-Image): 16 channels, 8× down in space and 4×
    /// in time, each channel normalised by its own mean and standard deviation (ComfyUI's `Wan21`).
    pub const WAN21: LatentFormat = LatentFormat {
        channels: 16,
        spatial_downscale: 8,
        temporal_downscale: 4,
        normalize: Normalize::PerChannel { mean: &WAN21_MEAN, std: &WAN21_STD },
        rgb: Some((&WAN21_RGB.0, WAN21_RGB.1)),
    };

    /// The Wan 2.2 VAE's latent space (Wan 2.2 TI2V 5B): 48 channels, 16× down in space and 4× in time,
    /// normalised per channel like [`LatentFormat::WAN21`] (ComfyUI's `Wan22`).
    pub const WAN22: LatentFormat = LatentFormat {
        channels: 48,
        spatial_downscale: 16,
        temporal_downscale: 4,
        normalize: Normalize::PerChannel { mean: &WAN22_MEAN, std: &WAN22_STD },
        rgb: Some((&WAN22_RGB.0, WAN22_RGB.1)),
    };

    /// The HunyuanVideo 1.0 VAE's latent space (ComfyUI's `HunyuanVideo`; Kandinsky 5's video models use it too):
    /// 16 channels, 8× down in space and 4× in time, scale 0.476986, no shift.
    pub const HUNYUAN_VIDEO: LatentFormat = LatentFormat {
        channels: 16,
        spatial_downscale: 8,
        temporal_downscale: 4,
        normalize: Normalize::Affine { scale: 0.476986, shift: 0.0 },
        rgb: Some((&HUNYUAN_VIDEO_RGB.0, HUNYUAN_VIDEO_RGB.1)),
    };

    /// The HunyuanVideo 1.5 VAE's latent space (ComfyUI's `HunyuanVideo15`): 32 channels, 16× down in space and
    /// 4× in time, scale 1.03682, no shift.
    pub const HUNYUAN_VIDEO15: LatentFormat = LatentFormat {
        channels: 32,
        spatial_downscale: 16,
        temporal_downscale: 4,
        normalize: Normalize::Affine { scale: 1.03682, shift: 0.0 },
        rgb: Some((&HUNYUAN_VIDEO15_RGB.0, HUNYUAN_VIDEO15_RGB.1)),
    };

    /// RGB pixels as latents (ComfyUI's `ChromaRadiance` format, the `pixel_space` VAE's): 3 channels, no
    /// downscale, the identity in and out, previews showing the channels as they are.
    pub const PIXELS: LatentFormat = LatentFormat {
        channels: 3,
        spatial_downscale: 1,
        temporal_downscale: 1,
        normalize: Normalize::Identity,
        rgb: Some((&PIXEL_RGB, [0.0; 3])),
    };

    /// VAE space → model space, for latents `[B, C, …]` of `shape` (row-major `values`).
    pub fn process_in(&self, values: &[f32], shape: &[usize]) -> Vec<f32> {
        self.map(values, shape, |n, c, z| match n {
            Normalize::Identity => z,
            Normalize::Affine { scale, shift } => (z - shift) * scale,
            Normalize::PerChannel { mean, std } => (z - mean[c]) / std[c],
        })
    }

    /// Model space → VAE space, the inverse of [`LatentFormat::process_in`].
    pub fn process_out(&self, values: &[f32], shape: &[usize]) -> Vec<f32> {
        self.map(values, shape, |n, c, x| match n {
            Normalize::Identity => x,
            Normalize::Affine { scale, shift } => x / scale + shift,
            Normalize::PerChannel { mean, std } => x * std[c] + mean[c],
        })
    }

    /// `f(normalize, channel, value)` of each value; channels beyond the format's (a latent of another
    /// family's width) keep their values.
    fn map(
        &self,
        values: &[f32],
        shape: &[usize],
        f: impl Fn(Normalize, usize, f32) -> f32,
    ) -> Vec<f32> {
        let channels = shape.get(1).copied().unwrap_or(1).max(1);
        let per_channel: usize = shape.iter().skip(2).product::<usize>().max(1);
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let c = (i / per_channel) % channels;
                match self.normalize {
                    Normalize::PerChannel { mean, .. } if c >= mean.len() => v,
                    n => f(n, c, v),
                }
            })
            .collect()
    }
}

/// How a latent space maps the VAE's values to the diffusion model's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Normalize {
    /// The VAE's space is the model's (FLUX.2: the VAE normalises its own latent).
    Identity,
    /// `(z − shift)·scale` for every value.
    Affine {
        /// Multiplies after the shift.
        scale: f32,
        /// Subtracted first.
        shift: f32,
    },
    /// `(z − mean[c]) / std[c]` for channel c.
    PerChannel {
        /// Each channel's mean.
        mean: &'static [f32],
        /// Each channel's standard deviation.
        std: &'static [f32],
    },
}

/// The Wan 2.1 latent space's per-channel means (ComfyUI's `latent_formats.Wan21`).
const WAN21_MEAN: [f32; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
/// The Wan 2.1 latent space's per-channel standard deviations.
const WAN21_STD: [f32; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.9160,
];
/// The Wan 2.1 latent space's linear map to RGB in [-1, 1] (rows per channel, then the bias), the measured
/// constants ComfyUI publishes for it.
const WAN21_RGB: ([[f32; 3]; 16], [f32; 3]) = (
    [
        [-0.1299, -0.1692, 0.2932],
        [0.0671, 0.0406, 0.0442],
        [0.3568, 0.2548, 0.1747],
        [0.0372, 0.2344, 0.1420],
        [0.0313, 0.0189, -0.0328],
        [0.0296, -0.0956, -0.0665],
        [-0.3477, -0.4059, -0.2925],
        [0.0166, 0.1902, 0.1975],
        [-0.0412, 0.0267, -0.1364],
        [-0.1293, 0.0740, 0.1636],
        [0.0680, 0.3019, 0.1128],
        [0.0032, 0.0581, 0.0639],
        [-0.1251, 0.0927, 0.1699],
        [0.0060, -0.0633, 0.0005],
        [0.3477, 0.2275, 0.2950],
        [0.1984, 0.0913, 0.1861],
    ],
    [-0.1835, -0.0868, -0.3360],
);

/// The Wan 2.2 latent space's per-channel means (ComfyUI's `latent_formats.Wan22`).
const WAN22_MEAN: [f32; 48] = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
    0.0891, 0.157, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
    -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.123, -0.0313,
    -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.052, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
    0.3573, -0.0548, -0.1681, -0.0667,
];
/// The Wan 2.2 latent space's per-channel standard deviations.
const WAN22_STD: [f32; 48] = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.499, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.06, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
];
/// ComfyUI's `HunyuanVideo` preview map (`latent_rgb_factors`, `latent_rgb_factors_bias`).
const HUNYUAN_VIDEO_RGB: ([[f32; 3]; 16], [f32; 3]) = (
    [
        [-0.0395, -0.0331, 0.0445],
        [0.0696, 0.0795, 0.0518],
        [0.0135, -0.0945, -0.0282],
        [0.0108, -0.0250, -0.0765],
        [-0.0209, 0.0032, 0.0224],
        [-0.0804, -0.0254, -0.0639],
        [-0.0991, 0.0271, -0.0669],
        [-0.0646, -0.0422, -0.0400],
        [-0.0696, -0.0595, -0.0894],
        [-0.0799, -0.0208, -0.0375],
        [0.1166, 0.1627, 0.0962],
        [0.1165, 0.0432, 0.0407],
        [-0.2315, -0.1920, -0.1355],
        [-0.0270, 0.0401, -0.0821],
        [-0.0616, -0.0997, -0.0727],
        [0.0249, -0.0469, -0.1703],
    ],
    [0.0259, -0.0192, -0.0761],
);

/// ComfyUI's `HunyuanVideo15` preview map (`latent_rgb_factors`, `latent_rgb_factors_bias`).
const HUNYUAN_VIDEO15_RGB: ([[f32; 3]; 32], [f32; 3]) = (
    [
        [0.0568, -0.0521, -0.0131],
        [0.0014, 0.0735, 0.0326],
        [0.0186, 0.0531, -0.0138],
        [-0.0031, 0.0051, 0.0288],
        [0.011, 0.0556, 0.0432],
        [-0.0041, -0.0023, -0.0485],
        [0.053, 0.0413, 0.0253],
        [0.0283, 0.0251, 0.0339],
        [0.0277, -0.0372, -0.0093],
        [0.0393, 0.0944, 0.1131],
        [0.002, 0.0251, 0.0037],
        [-0.0017, 0.0012, 0.0234],
        [0.0468, 0.0436, 0.0203],
        [0.0354, 0.0439, -0.0233],
        [0.009, 0.0123, 0.0346],
        [0.0382, 0.0029, 0.0217],
        [0.0261, -0.03, 0.003],
        [-0.0088, -0.022, -0.0283],
        [-0.0272, -0.0121, -0.0363],
        [-0.0664, -0.0622, 0.0144],
        [0.0414, 0.0479, 0.0529],
        [0.0355, 0.0612, -0.0247],
        [0.0147, 0.0264, 0.0174],
        [0.0438, 0.0038, 0.0542],
        [0.0431, -0.0573, -0.0033],
        [-0.0162, -0.0211, -0.0406],
        [-0.0487, -0.0295, -0.0393],
        [0.0005, -0.0109, 0.0253],
        [0.0296, 0.0591, 0.0353],
        [0.0119, 0.0181, -0.0306],
        [-0.0085, -0.0362, 0.0229],
        [0.0005, -0.0106, 0.0242],
    ],
    [0.0456, -0.0202, -0.0644],
);

/// The Wan 2.2 latent space's linear map to RGB in [-1, 1] (rows per channel, then the bias), the measured
/// constants ComfyUI publishes for it.
const WAN22_RGB: ([[f32; 3]; 48], [f32; 3]) = (
    [
        [0.0119, 0.0103, 0.0046],
        [-0.1062, -0.0504, 0.0165],
        [0.014, 0.0409, 0.0491],
        [-0.0813, -0.0677, 0.0607],
        [0.0656, 0.0851, 0.0808],
        [0.0264, 0.0463, 0.0912],
        [0.0295, 0.0326, 0.059],
        [-0.0244, -0.027, 0.0025],
        [0.0443, -0.0102, 0.0288],
        [-0.0465, -0.009, -0.0205],
        [0.0359, 0.0236, 0.0082],
        [-0.0776, 0.0854, 0.1048],
        [0.0564, 0.0264, 0.0561],
        [0.0006, 0.0594, 0.0418],
        [-0.0319, -0.0542, -0.0637],
        [-0.0268, 0.0024, 0.026],
        [0.0539, 0.0265, 0.0358],
        [-0.0359, -0.0312, -0.0287],
        [-0.0285, -0.1032, -0.1237],
        [0.1041, 0.0537, 0.0622],
        [-0.0086, -0.0374, -0.0051],
        [0.039, 0.067, 0.2863],
        [0.0069, 0.0144, 0.0082],
        [0.0006, -0.0167, 0.0079],
        [0.0313, -0.0574, -0.0232],
        [-0.1454, -0.0902, -0.0481],
        [0.0714, 0.0827, 0.0447],
        [-0.0304, -0.0574, -0.0196],
        [0.0401, 0.0384, 0.0204],
        [-0.0758, -0.0297, -0.0014],
        [0.0568, 0.1307, 0.1372],
        [-0.0055, -0.031, -0.038],
        [0.0239, -0.0305, 0.0325],
        [-0.0663, -0.0673, -0.014],
        [-0.0416, -0.0047, -0.0023],
        [0.0166, 0.0112, -0.0093],
        [-0.0211, 0.0011, 0.0331],
        [0.1833, 0.1466, 0.225],
        [-0.0368, 0.037, 0.0295],
        [-0.3441, -0.3543, -0.2008],
        [-0.0479, -0.0489, -0.042],
        [-0.066, -0.0153, 0.08],
        [-0.0101, 0.0068, 0.0156],
        [-0.069, -0.0452, -0.0927],
        [-0.0145, 0.0041, 0.0015],
        [0.0421, 0.0451, 0.0373],
        [0.0504, -0.0483, -0.0356],
        [-0.0837, 0.0168, 0.0055],
    ],
    [0.0317, -0.0878, -0.1388],
);

/// ComfyUI's `SD3.latent_rgb_factors`.
const SD3_RGB: [[f32; 3]; 16] = [
    [-0.0922, -0.0175, 0.0749],
    [0.0311, 0.0633, 0.0954],
    [0.1994, 0.0927, 0.0458],
    [0.0856, 0.0339, 0.0902],
    [0.0587, 0.0272, -0.0496],
    [-0.0006, 0.1104, 0.0309],
    [0.0978, 0.0306, 0.0427],
    [-0.0042, 0.1038, 0.1358],
    [-0.0194, 0.0020, 0.0669],
    [-0.0488, 0.0130, -0.0268],
    [0.0922, 0.0988, 0.0951],
    [-0.0278, 0.0524, -0.0542],
    [0.0332, 0.0456, 0.0895],
    [-0.0069, -0.0030, -0.0810],
    [-0.0596, -0.0465, -0.0293],
    [-0.1448, -0.1463, -0.1189],
];

/// ComfyUI's `SDXL.latent_rgb_factors`.
const SDXL_RGB: [[f32; 3]; 4] = [
    [0.3651, 0.4232, 0.4341],
    [-0.2533, -0.0042, 0.1068],
    [0.1076, 0.1111, -0.0362],
    [-0.3165, -0.2492, -0.2188],
];
/// ComfyUI's `SDXL.latent_rgb_factors_bias`.
const SDXL_RGB_BIAS: [f32; 3] = [0.1084, -0.0175, -0.0011];

/// The SD 1.x latent space's linear map to RGB (ComfyUI's `SD15.latent_rgb_factors`, no bias): measured
/// constants, like the Flux VAE's below.
const SD15_RGB: [[f32; 3]; 4] = [
    [0.3512, 0.2297, 0.3227],
    [0.3250, 0.4974, 0.2350],
    [-0.2829, 0.1762, 0.2721],
    [-0.2120, -0.2616, -0.7177],
];

/// The identity map of pixel latents to RGB.
const PIXEL_RGB: [[f32; 3]; 3] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

/// The Flux VAE latent space's linear map to RGB in [-1, 1]: one row per channel, then the bias. These are
/// measured constants of that latent space (the least-squares fit of decoded colours on latents that ComfyUI
/// and InvokeAI publish alike), not code.
const FLUX_RGB: ([[f32; 3]; 16], [f32; 3]) = (
    [
        [-0.0346, 0.0244, 0.0681],
        [0.0034, 0.0210, 0.0687],
        [0.0275, -0.0668, -0.0433],
        [-0.0174, 0.0160, 0.0617],
        [0.0859, 0.0721, 0.0329],
        [0.0004, 0.0383, 0.0115],
        [0.0405, 0.0861, 0.0915],
        [-0.0236, -0.0185, -0.0259],
        [-0.0245, 0.0250, 0.1180],
        [0.1008, 0.0755, -0.0421],
        [-0.0515, 0.0201, 0.0011],
        [0.0428, -0.0012, -0.0036],
        [0.0817, 0.0765, 0.0749],
        [-0.1264, -0.0522, -0.1103],
        [-0.0280, -0.0881, -0.0499],
        [-0.1262, -0.0982, -0.0778],
    ],
    [-0.0329, -0.0718, -0.0851],
);

/// The FLUX.2 latent space's linear map to RGB of its 32 unpatchified channels (ComfyUI's
/// `Flux2.latent_rgb_factors`, measured constants; the bias is FLUX.1's).
const FLUX2_RGB: [[f32; 3]; 32] = [
    [0.0058, 0.0113, 0.0073],
    [0.0495, 0.0443, 0.0836],
    [-0.0099, 0.0096, 0.0644],
    [0.2144, 0.3009, 0.3652],
    [0.0166, -0.0039, -0.0054],
    [0.0157, 0.0103, -0.0160],
    [-0.0398, 0.0902, -0.0235],
    [-0.0052, 0.0095, 0.0109],
    [-0.3527, -0.2712, -0.1666],
    [-0.0301, -0.0356, -0.0180],
    [-0.0107, 0.0078, 0.0013],
    [0.0746, 0.0090, -0.0941],
    [0.0156, 0.0169, 0.0070],
    [-0.0034, -0.0040, -0.0114],
    [0.0032, 0.0181, 0.0080],
    [-0.0939, -0.0008, 0.0186],
    [0.0018, 0.0043, 0.0104],
    [0.0284, 0.0056, -0.0127],
    [-0.0024, -0.0022, -0.0030],
    [0.1207, -0.0026, 0.0065],
    [0.0128, 0.0101, 0.0142],
    [0.0137, -0.0072, -0.0007],
    [0.0095, 0.0092, -0.0059],
    [0.0000, -0.0077, -0.0049],
    [-0.0465, -0.0204, -0.0312],
    [0.0095, 0.0012, -0.0066],
    [0.0290, -0.0034, 0.0025],
    [0.0220, 0.0169, -0.0048],
    [-0.0332, -0.0457, -0.0468],
    [-0.0085, 0.0389, 0.0609],
    [-0.0076, 0.0003, -0.0043],
    [-0.0111, -0.0460, -0.0614],
];

/// [`FLUX2_RGB`] for the patchified latent: channel `c·4 + p` (p the position in the 2×2 patch) gets a
/// quarter of row c, so a latent position's colour is the mean of its patch's four.
const FLUX2_RGB_PATCHES: [[f32; 3]; 128] = {
    let mut rows = [[0.0; 3]; 128];
    let mut i = 0;
    while i < 128 {
        let row = FLUX2_RGB[i / 4];
        rows[i] = [row[0] / 4.0, row[1] / 4.0, row[2] / 4.0];
        i += 1;
    }
    rows
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flux_shifts_and_scales_every_value() {
        let got = LatentFormat::FLUX.process_in(&[0.1159, 1.1159], &[1, 2, 1, 1]);
        assert_eq!(got, [0.0, 0.3611]);
        let back = LatentFormat::FLUX.process_out(&got, &[1, 2, 1, 1]);
        assert!((back[1] - 1.1159).abs() < 1e-6);
    }

    #[test]
    fn flux2_is_the_identity_and_previews_each_patch_as_its_mean() {
        let shape = [1, 128, 1, 2];
        let values: Vec<f32> = (0..256).map(|i| i as f32 * 0.25 - 3.0).collect();
        assert_eq!(LatentFormat::FLUX2.process_in(&values, &shape), values);
        assert_eq!(LatentFormat::FLUX2.process_out(&values, &shape), values);
        let (rows, bias) = LatentFormat::FLUX2.rgb.expect("a preview map");
        assert_eq!((rows.len(), bias), (128, FLUX_RGB.1));
        // Channels 12..16 are the patch of unpatchified channel 3: each a quarter of its row.
        for row in &rows[12..16] {
            assert_eq!(*row, [0.2144 / 4.0, 0.3009 / 4.0, 0.3652 / 4.0]);
        }
    }

    #[test]
    fn wan21_normalises_each_channel_by_its_own_mean_and_deviation() {
        // [B 2, C 16, h 1, w 2]: value (b, c, x) = c + x.
        let shape = [2, 16, 1, 2];
        let values: Vec<f32> = (0..2 * 16 * 2).map(|i| ((i / 2) % 16 + i % 2) as f32).collect();
        let model = LatentFormat::WAN21.process_in(&values, &shape);
        for (i, (&z, &x)) in values.iter().zip(&model).enumerate() {
            let c = (i / 2) % 16;
            assert_eq!(x, (z - WAN21_MEAN[c]) / WAN21_STD[c], "value {i}");
        }
        let back = LatentFormat::WAN21.process_out(&model, &shape);
        assert!(back.iter().zip(&values).all(|(a, b)| (a - b).abs() < 1e-5));
    }
}
