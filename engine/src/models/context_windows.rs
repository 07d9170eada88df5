//! Context windows (`ContextWindowsManual`, ComfyUI's `comfy/context_windows.py`): a model call on a long latent
//! made as calls on windows of its frames, their outputs fused by weights.
//!
//! [`ContextWindows`] is what the node puts on the `MODEL`: the schedule that picks the windows of each step,
//! the fuse method that weighs each window's output per frame, and what every window keeps of the whole
//! (conditioning or latent frames retained at the front of each window, and the causal fix: the frame before
//! the window put in front of it and its output dropped). With `freenoise` the starting noise's frames past the
//! first window repeat earlier frames in a seeded shuffle. The sampler reads it (`Guided`'s windowed calls).

use kiln_models::noise::TorchGenerator;

/// How the windows are picked (`context_schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// `standard_static`: the same windows every step, each `overlap` frames into the one before, the last
    /// moved back to end at the last frame.
    StaticStandard,
    /// `standard_uniform`: windows shifted by a step-dependent offset, wrapped windows moved to the end.
    UniformStandard,
    /// `looped_uniform`: windows shifted by a step-dependent offset, wrapping past the last frame.
    UniformLooped,
    /// `batched`: consecutive windows without overlap, the last one shorter.
    Batched,
}

impl Schedule {
    /// The schedule by its option name.
    pub fn from_name(name: &str) -> Option<Schedule> {
        match name {
            "standard_static" => Some(Schedule::StaticStandard),
            "standard_uniform" => Some(Schedule::UniformStandard),
            "looped_uniform" => Some(Schedule::UniformLooped),
            "batched" => Some(Schedule::Batched),
            _ => None,
        }
    }
}

/// How the windows' outputs are combined per frame (`fuse_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fuse {
    /// Weighted by the distance from the window's edge (1, 2, …, 2, 1), averaged.
    Pyramid,
    /// A running average weighted by each frame's nearness to its window's centre.
    Relative,
    /// Averaged.
    Flat,
    /// Weight 1, ramped linearly over the overlap at the window's inner edges.
    OverlapLinear,
}

impl Fuse {
    /// The fuse method by its option name.
    pub fn from_name(name: &str) -> Option<Fuse> {
        match name {
            "pyramid" => Some(Fuse::Pyramid),
            "relative" => Some(Fuse::Relative),
            "flat" => Some(Fuse::Flat),
            "overlap-linear" => Some(Fuse::OverlapLinear),
            _ => None,
        }
    }
}

/// `ContextWindowsManual`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextWindows {
    /// The schedule.
    pub schedule: Schedule,
    /// The fuse method.
    pub fuse: Fuse,
    /// Frames per window.
    pub length: usize,
    /// Frames each window shares with the one before.
    pub overlap: usize,
    /// The largest stride of the uniform schedules (1, 2, 4, … up to 2^(stride − 1)).
    pub stride: usize,
    /// Whether the looped schedule's windows wrap from the last frame to the first.
    pub closed_loop: bool,
    /// The latent's dimension the windows cut.
    pub dim: usize,
    /// Shuffle the starting noise's later frames from earlier ones (FreeNoise).
    pub freenoise: bool,
    /// Window positions whose conditioning is the whole latent's at the same index (`cond_retain_index_list`).
    pub cond_retain: Vec<usize>,
    /// Each window reads one of several prompts of a side, by where the window's centre lies.
    pub split_conds: bool,
    /// Window positions whose latent is the whole latent's at the same index (`latent_retain_index_list`).
    pub latent_retain: Vec<usize>,
    /// Put the frame before a window in front of it and drop its output (`causal_window_fix`).
    pub causal_fix: bool,
}

/// One window of one model call: the frames it reads, in order (the causal fix's frame first, when it has one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The frames whose outputs the window gives (`index_list`).
    pub frames: Vec<usize>,
    /// The frame before them read in front and dropped from the output.
    pub anchor: Option<usize>,
}

impl Window {
    /// Every frame the call reads, the anchor first.
    pub fn read(&self) -> Vec<usize> {
        self.anchor.iter().copied().chain(self.frames.iter().copied()).collect()
    }

    /// Where the window's centre lies in a latent of `total` frames, 0–1 (ComfyUI's `center_ratio`).
    pub fn center_ratio(&self, total: usize) -> f64 {
        let (lo, hi) = (self.frames.iter().min(), self.frames.iter().max());
        match (lo, hi) {
            (Some(&lo), Some(&hi)) => (lo + hi) as f64 / (2 * total.max(1)) as f64,
            _ => 0.0,
        }
    }

    /// The prompt of `count` a window of a latent of `total` frames reads when prompts are split to windows.
    pub fn region(&self, count: usize, total: usize) -> usize {
        let region = (self.center_ratio(total) * count as f64) as usize;
        region.min(count.saturating_sub(1))
    }
}

/// Why a list of indices cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a list of frame indices: write numbers separated by commas, such as `0` or `0, 1`"
)]
pub struct BadIndexList(pub String);

/// A comma-separated index list (`"0"`, `"0, 2"`; empty for none), as ComfyUI's handler parses it.
pub fn parse_index_list(text: &str) -> Result<Vec<usize>, BadIndexList> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|s| s.trim().parse::<usize>().map_err(|_| BadIndexList(text.to_owned())))
        .collect()
}

impl ContextWindows {
    /// Whether a latent of `frames` frames along the windows' dimension is cut into windows.
    pub fn applies(&self, frames: usize) -> bool {
        frames > self.length
    }

    /// The windows of sampling step `step` over `frames` frames, each with the causal fix's anchor when set.
    pub fn windows(&self, frames: usize, step: usize) -> Result<Vec<Window>, String> {
        if self.fuse == Fuse::OverlapLinear && self.overlap == 0 && frames > self.length {
            return Err("the overlap-linear fuse ramps each window over its overlap: set context_overlap to \
                        at least 1, or choose another fuse_method"
                .to_owned());
        }
        let lists = match self.schedule {
            Schedule::StaticStandard if self.overlap >= self.length && frames > self.length => {
                return Err(self.overlap_too_long());
            }
            Schedule::StaticStandard => static_standard(frames, self.length, self.overlap),
            Schedule::Batched => batched(frames, self.length),
            Schedule::UniformStandard => self.uniform_standard(frames, step)?,
            Schedule::UniformLooped => self.uniform(frames, step, self.closed_loop, true)?,
        };
        Ok(lists
            .into_iter()
            .map(|frames_of| {
                let anchor = match frames_of.first() {
                    Some(&first) if self.causal_fix && first >= 1 => Some(first - 1),
                    _ => None,
                };
                Window { frames: frames_of, anchor }
            })
            .collect())
    }

    /// Why windows that overlap by their whole length (or more) cannot be made.
    fn overlap_too_long(&self) -> String {
        format!(
            "context windows of {} frames cannot overlap by {}: the overlap must be shorter than the window",
            self.length, self.overlap
        )
    }

    /// The weights of a window's frames for the pyramid, flat and overlap-linear fuses (a window of `len`
    /// frames `idxs` of `total`).
    pub fn weights(&self, idxs: &[usize], total: usize) -> Vec<f32> {
        let len = idxs.len();
        match self.fuse {
            Fuse::Flat => vec![1.0; len],
            Fuse::Pyramid | Fuse::Relative => pyramid(len),
            Fuse::OverlapLinear => {
                let mut w = vec![1.0f32; len];
                let n = self.overlap.min(len);
                if n > 0 {
                    if idxs.iter().min().is_some_and(|&m| m > 0) {
                        w[..n].copy_from_slice(&ramp(1e-37, 1.0, n));
                    }
                    if idxs.iter().max().is_some_and(|&m| m + 1 < total) {
                        w[len - n..].copy_from_slice(&ramp(1.0, 1e-37, n));
                    }
                }
                w
            }
        }
    }

    /// FreeNoise: the noise `values` of `shape` with, past the first window, each stretch of
    /// `length − overlap` frames along the windows' dimension replaced by a seeded shuffle of the frames a
    /// window before (ComfyUI's `apply_freenoise`, torch's `randperm` on a generator seeded with `seed`).
    pub fn freenoise(&self, values: &mut [f32], shape: &[usize], seed: u64) {
        let Some(&frames) = shape.get(self.dim) else { return };
        let delta = self.length.saturating_sub(self.overlap);
        if delta == 0 || frames <= self.length {
            return;
        }
        let outer: usize = shape[..self.dim].iter().product();
        let inner: usize = shape[self.dim + 1..].iter().product();
        let mut generator = TorchGenerator::new(seed);
        let mut start = 0;
        while start < frames - self.length {
            let place = start + self.length;
            let count = delta.min(frames - place);
            let perm = generator.randperm(count);
            for o in 0..outer {
                let base = o * frames * inner;
                let sources: Vec<Vec<f32>> = perm
                    .iter()
                    .map(|&p| values[base + (start + p) * inner..][..inner].to_vec())
                    .collect();
                for (k, source) in sources.iter().enumerate() {
                    values[base + (place + k) * inner..][..inner].copy_from_slice(source);
                }
            }
            start += delta;
        }
    }

    /// `standard_uniform`: the uniform windows, those that wrap moved to end at the last frame (a window starting
    /// where the wrap began inserted after it when the next lacks that frame), duplicates dropped.
    fn uniform_standard(&self, frames: usize, step: usize) -> Result<Vec<Vec<usize>>, String> {
        let mut windows = self.uniform(frames, step, false, false)?;
        let mut duplicates = Vec::new();
        let mut i = 0;
        while i < windows.len() {
            if let Some(at) = roll_over(&windows[i], frames) {
                let value = windows[i][at];
                shift_to_end(&mut windows[i], frames);
                let next = (i + 1) % windows.len();
                if !windows[next].contains(&value) {
                    windows.insert(i + 1, (value..value + self.length).collect());
                }
            }
            if (0..i).any(|j| windows[j] == windows[i]) {
                duplicates.push(i);
            }
            i += 1;
        }
        for i in duplicates.into_iter().rev() {
            windows.remove(i);
        }
        Ok(windows)
    }

    /// The uniform windows (animatediff-cli's): for each stride 1, 2, 4, …, windows of `length` frames that far
    /// apart, every `length·stride − overlap` frames from a step-dependent offset, wrapping past the last frame
    /// (to `closed` past it when looped). `looped` keeps one window over all frames shorter than `length`.
    fn uniform(
        &self,
        frames: usize,
        step: usize,
        closed: bool,
        looped: bool,
    ) -> Result<Vec<Vec<usize>>, String> {
        if (looped && frames < self.length) || (!looped && frames <= self.length) {
            return Ok(vec![(0..frames).collect()]);
        }
        let levels = (frames as f64 / self.length as f64).log2().ceil() as i64 + 1;
        let strides = (self.stride as i64).min(levels).max(0) as u32;
        let halving = ordered_halving(step);
        let mut windows = Vec::new();
        for level in 0..strides {
            let context_step = 1usize << level;
            let pad = (frames as f64 * halving).round_ties_even() as i64;
            let start = (halving * context_step as f64) as i64 + pad;
            let end = frames as i64 + pad - if closed { 0 } else { self.overlap as i64 };
            let jump = (self.length * context_step) as i64 - self.overlap as i64;
            if jump <= 0 {
                return Err(self.overlap_too_long());
            }
            let mut j = start;
            while j < end {
                windows.push(
                    (0..self.length).map(|k| ((j as usize) + k * context_step) % frames).collect(),
                );
                j += jump;
            }
        }
        Ok(windows)
    }
}

/// `torch.linspace(start, end, n)` in f32 for the overlap-linear ramps: the first half start + i·step, the rest
/// end − (n − 1 − i)·step, each rounded once. torch's CPU kernel computes the lanes of a vector from one base, so
/// a value may differ from its by a unit or two in the last place (the weights are normalised: the fused output
/// moves by as little).
fn ramp(start: f32, end: f32, n: usize) -> Vec<f32> {
    let step = if n > 1 { (end - start) / (n - 1) as f32 } else { 0.0 };
    let (start, end, step) = (f64::from(start), f64::from(end), f64::from(step));
    (0..n)
        .map(|i| if n == 1 || i < n / 2 { start + step * i as f64 } else { end - step * (n - 1 - i) as f64 } as f32)
        .collect()
}

/// `standard_static`'s windows.
fn static_standard(frames: usize, length: usize, overlap: usize) -> Vec<Vec<usize>> {
    if frames <= length {
        return vec![(0..frames).collect()];
    }
    let delta = length.saturating_sub(overlap).max(1);
    let mut windows = Vec::new();
    let mut start = 0;
    while start < frames {
        let ending = start + length;
        if ending >= frames {
            let first = start - (ending - frames);
            windows.push((first..first + length).collect());
            break;
        }
        windows.push((start..ending).collect());
        start += delta;
    }
    windows
}

/// `batched`'s windows.
fn batched(frames: usize, length: usize) -> Vec<Vec<usize>> {
    if frames <= length {
        return vec![(0..frames).collect()];
    }
    (0..frames).step_by(length.max(1)).map(|s| (s..(s + length).min(frames)).collect()).collect()
}

/// The pyramid weights of a window of `len` frames: 1, 2, …, up to the middle, and back down.
fn pyramid(len: usize) -> Vec<f32> {
    let half = len.div_ceil(2);
    (0..len).map(|i| (i.min(len - 1 - i) + 1).min(half) as f32).collect()
}

/// The reversed bits of `val` over 64 bits as a fraction of 2^64 (the uniform schedules' step offset).
pub fn ordered_halving(val: usize) -> f64 {
    (val as u64).reverse_bits() as f64 / 18_446_744_073_709_551_616.0
}

/// Where a window wraps past the last frame (the first position whose frame is smaller than the one before).
fn roll_over(window: &[usize], frames: usize) -> Option<usize> {
    let mut prev: Option<usize> = None;
    for (i, &v) in window.iter().enumerate() {
        let v = v % frames;
        if prev.is_some_and(|p| v < p) {
            return Some(i);
        }
        prev = Some(v);
    }
    None
}

/// A wrapped window shifted to end at the last frame, its spacing kept.
fn shift_to_end(window: &mut [usize], frames: usize) {
    let first = window[0];
    for v in window.iter_mut() {
        *v = (*v + frames - first) % frames;
    }
    let end_delta = frames - window[window.len() - 1] - 1;
    for v in window.iter_mut() {
        *v += end_delta;
    }
}

/// The running per-frame weighted average the relative fuse keeps: for frame `idx` at its window's position,
/// the bias 1 − |idx − centre| / (half width + 0.005), at least 0.01, against the bias gathered so far.
pub fn relative_bias(window: &[usize], idx: usize) -> f64 {
    let (first, last) = (window[0] as f64, window[window.len() - 1] as f64);
    let bias = 1.0 - (idx as f64 - (first + last) / 2.0).abs() / ((last - first + 1e-2) / 2.0);
    bias.max(1e-2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_lists_parse_like_comfyuis() {
        assert_eq!(parse_index_list(""), Ok(vec![]));
        assert_eq!(parse_index_list("0"), Ok(vec![0]));
        assert_eq!(parse_index_list(" 0, 2 "), Ok(vec![0, 2]));
        assert!(parse_index_list("a").is_err());
    }

    /// `scripts/reference/wan_animate2.py`'s record of ComfyUI's `context_windows.py` functions.
    fn reference() -> serde_json::Value {
        serde_json::from_str(&crate::fixtures::text("context_windows/context_windows.json"))
            .expect("JSON")
    }

    fn settings(case: &serde_json::Value, schedule: Schedule, fuse: Fuse) -> ContextWindows {
        let n = |k: &str| case[k].as_u64().map_or(0, |v| v as usize);
        ContextWindows {
            schedule,
            fuse,
            length: n("context_length"),
            overlap: n("context_overlap"),
            stride: n("context_stride").max(1),
            closed_loop: case["closed_loop"].as_bool().unwrap_or(false),
            dim: n("dim"),
            freenoise: true,
            cond_retain: Vec::new(),
            split_conds: false,
            latent_retain: Vec::new(),
            causal_fix: false,
        }
    }

    fn indices(v: &serde_json::Value) -> Vec<usize> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|i| i.as_u64().expect("an index") as usize)
            .collect()
    }

    fn floats(v: &serde_json::Value) -> Vec<f32> {
        v.as_array().expect("a list").iter().map(|x| x.as_f64().expect("a number") as f32).collect()
    }

    #[test]
    fn every_schedule_picks_comfyuis_windows() {
        let reference = reference();
        let cases = reference["schedules"].as_array().expect("cases");
        assert!(cases.len() > 500);
        for case in cases {
            let name = case["schedule"].as_str().expect("a name");
            let schedule = Schedule::from_name(name).expect("a schedule");
            let cw = settings(case, schedule, Fuse::Pyramid);
            let frames = case["num_frames"].as_u64().expect("frames") as usize;
            let step = case["step"].as_u64().expect("step") as usize;
            let got: Vec<Vec<usize>> =
                cw.windows(frames, step).expect("windows").into_iter().map(|w| w.frames).collect();
            let want: Vec<Vec<usize>> =
                case["windows"].as_array().expect("windows").iter().map(indices).collect();
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn every_fuse_weighs_frames_as_comfyui_does() {
        let reference = reference();
        for case in reference["weights"].as_array().expect("cases") {
            let fuse = Fuse::from_name(case["method"].as_str().expect("a name")).expect("a fuse");
            let cw = settings(case, Schedule::StaticStandard, fuse);
            let (idxs, full) =
                (indices(&case["idxs"]), case["full_length"].as_u64().unwrap() as usize);
            if case["weights"].is_null() {
                // ComfyUI fails on these (overlap-linear without an overlap); Kiln refuses such windows.
                assert!(cw.windows(full.max(cw.length + 1), 0).is_err(), "{case}");
                continue;
            }
            let (got, want) = (cw.weights(&idxs, full), floats(&case["weights"]));
            assert_eq!(got.len(), want.len(), "{case}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 3e-7 * w.abs().max(1e-30), "{case}: {got:?}");
            }
        }
        for [val, want] in reference["ordered_halving"].as_array().expect("pairs").iter().map(|p| {
            let p = p.as_array().expect("a pair");
            [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()]
        }) {
            assert_eq!(ordered_halving(val as usize), want, "ordered_halving({val})");
        }
    }

    #[test]
    fn freenoise_shuffles_later_frames_with_torchs_randperm() {
        let reference = reference();
        for case in reference["randperm"].as_array().expect("cases") {
            let seed = case["seed"].as_u64().expect("a seed");
            let n = case["n"].as_u64().expect("n") as usize;
            assert_eq!(TorchGenerator::new(seed).randperm(n), indices(&case["perm"]), "{case}");
        }
        for case in reference["freenoise"].as_array().expect("cases") {
            let cw = settings(case, Schedule::StaticStandard, Fuse::Pyramid);
            let shape = indices(&case["shape"]);
            let mut values: Vec<f32> = (0..shape[cw.dim]).map(|f| f as f32).collect();
            cw.freenoise(&mut values, &shape, case["seed"].as_u64().expect("a seed"));
            let want: Vec<f32> =
                indices(&case["source_order"]).into_iter().map(|f| f as f32).collect();
            assert_eq!(values, want, "{case}");
        }
    }

    #[test]
    fn pyramid_rises_to_the_middle() {
        assert_eq!(pyramid(4), vec![1.0, 2.0, 2.0, 1.0]);
        assert_eq!(pyramid(5), vec![1.0, 2.0, 3.0, 2.0, 1.0]);
        assert_eq!(pyramid(1), vec![1.0]);
    }
}
