//! `AUDIO`: ComfyUI's audio dict, a waveform `[B, channels, samples]` in f32 and its sample rate.
//!
//! Invariant: the waveform is three-dimensional and the rate is positive; every constructor checks both.

use crate::tensor::Tensor;

use super::MediaError;

/// A batch of clips with one sample rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    waveform: Tensor,
    sample_rate: u32,
}

impl Audio {
    /// Audio from a `[B, channels, samples]` waveform.
    pub fn new(waveform: Tensor, sample_rate: u32) -> Result<Audio, MediaError> {
        if waveform.shape().len() != 3 {
            return Err(MediaError::Invalid(format!(
                "an audio waveform is [batch, channels, samples], got shape {:?}",
                waveform.shape()
            )));
        }
        if sample_rate == 0 {
            return Err(MediaError::Invalid("the sample rate must be positive".to_owned()));
        }
        Ok(Audio { waveform, sample_rate })
    }

    /// One clip from planar channels of equal length.
    pub fn from_planar(channels: Vec<Vec<f32>>, sample_rate: u32) -> Result<Audio, MediaError> {
        let samples = channels.first().map_or(0, Vec::len);
        if channels.iter().any(|c| c.len() != samples) {
            return Err(MediaError::Invalid("audio channels differ in length".to_owned()));
        }
        let shape = vec![1, channels.len(), samples];
        let data = channels.into_iter().flatten().collect();
        let waveform = Tensor::new(shape, data).map_err(|e| MediaError::Invalid(e.to_string()))?;
        Audio::new(waveform, sample_rate)
    }

    /// The waveform, `[B, channels, samples]`.
    pub fn waveform(&self) -> &Tensor {
        &self.waveform
    }

    /// Samples per second.
    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Clips in the batch.
    pub fn batch(&self) -> usize {
        self.waveform.shape()[0]
    }

    /// Channels per clip.
    pub fn channels(&self) -> usize {
        self.waveform.shape()[1]
    }

    /// Samples per channel.
    pub fn samples(&self) -> usize {
        self.waveform.shape()[2]
    }

    /// One channel of one clip.
    pub fn channel(&self, item: usize, channel: usize) -> &[f32] {
        let samples = self.samples();
        let start = (item * self.channels() + channel) * samples;
        &self.waveform.data()[start..start + samples]
    }

    /// Every channel of every clip through `f`, which may change their length (the same for each), at
    /// `sample_rate`.
    pub fn map_channels(
        &self,
        sample_rate: u32,
        mut f: impl FnMut(&[f32]) -> Vec<f32>,
    ) -> Result<Audio, MediaError> {
        let rows: Vec<Vec<f32>> = (0..self.batch())
            .flat_map(|b| (0..self.channels()).map(move |c| (b, c)))
            .map(|(b, c)| f(self.channel(b, c)))
            .collect();
        let samples = rows.first().map_or(0, Vec::len);
        if rows.iter().any(|r| r.len() != samples) {
            return Err(MediaError::Invalid("audio channels differ in length".to_owned()));
        }
        let shape = vec![self.batch(), self.channels(), samples];
        let waveform =
            Tensor::new(shape, rows.concat()).map_err(|e| MediaError::Invalid(e.to_string()))?;
        Audio::new(waveform, sample_rate)
    }

    /// The clips at `sample_rate`, resampled as torchaudio's `functional.resample` does (unchanged at their own
    /// rate).
    pub fn resampled(&self, sample_rate: u32) -> Result<Audio, MediaError> {
        if sample_rate == self.sample_rate {
            return Ok(self.clone());
        }
        let resampler = kiln_models::resample::Resampler::new(self.sample_rate, sample_rate)
            .map_err(|e| MediaError::Invalid(e.to_string()))?;
        self.map_channels(sample_rate, |x| resampler.apply(x))
    }

    /// Samples `start..end` of every channel (clamped to the clip).
    pub fn slice(&self, start: usize, end: usize) -> Result<Audio, MediaError> {
        let samples = self.samples();
        let (start, end) = (start.min(samples), end.clamp(start.min(samples), samples));
        let data: Vec<f32> = self
            .waveform
            .data()
            .chunks(samples.max(1))
            .take(self.batch() * self.channels())
            .flat_map(|row| row[start..end].iter().copied())
            .collect();
        let shape = vec![self.batch(), self.channels(), end - start];
        let waveform = Tensor::new(shape, data).map_err(|e| MediaError::Invalid(e.to_string()))?;
        Audio::new(waveform, self.sample_rate)
    }
}
