//! A dense `f32` tensor in row-major order: the data that flows between nodes (images are `[B, H, W, C]` in
//! `0..=1`, masks `[B, H, W]`, latents `[B, C, H, W]`), as upstream ComfyUI's torch tensors.
//!
//! Invariant: `data.len()` is the product of `shape`. Data is shared (`Arc`) so cached outputs and node inputs
//! never copy; writers make their own buffer.

use std::sync::Arc;

/// A dense `f32` tensor.
#[derive(Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Arc<Vec<f32>>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor{:?}", self.shape)
    }
}

/// A shape and a data length that do not agree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a tensor of shape {shape:?} needs {expected} values, got {got}")]
pub struct ShapeError {
    /// The shape asked for.
    pub shape: Vec<usize>,
    /// Its number of elements.
    pub expected: usize,
    /// The data length given.
    pub got: usize,
}

impl Tensor {
    /// A tensor from a shape and its data.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor, ShapeError> {
        let expected = shape.iter().product();
        if data.len() != expected {
            return Err(ShapeError { shape, expected, got: data.len() });
        }
        Ok(Tensor { shape, data: Arc::new(data) })
    }

    /// A tensor filled with one value.
    pub fn full(shape: Vec<usize>, value: f32) -> Tensor {
        let len = shape.iter().product();
        Tensor { shape, data: Arc::new(vec![value; len]) }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// Size in bytes of the values (for cache accounting).
    pub fn byte_size(&self) -> usize {
        self.data.len() * std::mem::size_of::<f32>()
    }

    /// Applies `f` to every value.
    pub fn map(&self, f: impl Fn(f32) -> f32) -> Tensor {
        Tensor {
            shape: self.shape.clone(),
            data: Arc::new(self.data.iter().map(|&v| f(v)).collect()),
        }
    }

    /// The size of dimension `dim` (0 when the tensor has fewer dimensions).
    pub fn dim(&self, dim: usize) -> usize {
        self.shape.get(dim).copied().unwrap_or(0)
    }

    /// Concatenates tensors along dimension 0 (the batch). All other dimensions must agree.
    pub fn concat_batch(parts: &[&Tensor]) -> Result<Tensor, ShapeError> {
        let Some(first) = parts.first() else {
            return Tensor::new(vec![0], Vec::new());
        };
        let rest_shape = &first.shape[1..];
        let mut data = Vec::new();
        let mut batch = 0;
        for part in parts {
            if &part.shape[1..] != rest_shape {
                return Err(ShapeError {
                    shape: part.shape.clone(),
                    expected: first.data.len(),
                    got: part.data.len(),
                });
            }
            batch += part.shape[0];
            data.extend_from_slice(&part.data);
        }
        let mut shape = vec![batch];
        shape.extend_from_slice(rest_shape);
        Tensor::new(shape, data)
    }
}

#[cfg(test)]
mod tests {
    use super::Tensor;

    #[test]
    fn shape_and_data_must_agree() {
        assert!(Tensor::new(vec![2, 2], vec![0.0; 4]).is_ok());
        let error = Tensor::new(vec![2, 3], vec![0.0; 4]).unwrap_err();
        assert_eq!((error.expected, error.got), (6, 4));
    }

    #[test]
    fn batches_concatenate() {
        let a = Tensor::full(vec![1, 2, 2, 3], 0.0);
        let b = Tensor::full(vec![2, 2, 2, 3], 1.0);
        let c = Tensor::concat_batch(&[&a, &b]).expect("same image size");
        assert_eq!(c.shape(), &[3, 2, 2, 3]);
        assert_eq!(c.data()[12], 1.0);
        assert!(Tensor::concat_batch(&[&a, &Tensor::full(vec![1, 3, 2, 3], 0.0)]).is_err());
    }
}
