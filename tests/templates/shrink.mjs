// The one way the template suite shrinks a converted prompt so that every template runs in seconds on tiny
// synthetic weights on a CPU, whatever size the template asks for:
//
// - sizes (`width`, `height`) to 64 px, or the node's minimum when that is larger, and a total-pixels target
//   (`megapixels`) to 64² pixels, or the node's minimum;
// - sampling steps (`steps`) to 2, and a KSamplerAdvanced's `start_at_step`/`end_at_step` scaled with them
//   (a stage that had steps keeps at least one), so a two-stage template keeps its split; a `SplitSigmas` then
//   splits at step 1, so both halves have a step; steps a `ComfySwitchNode` chooses (a template's "fast
//   LoRA on/off" switch) shrink on both of its branches;
// - frames (`length`, `frames`, `num_frames`, `video_frames`, and `motion_frame_count`, the frames an
//   InfiniteTalk continuation reads of the clip before) to the node's minimum (1 when it has none);
// - batches (`batch_size`) to 1;
// - generated text (`TextGenerate`'s `max_length`, in tokens) to 8.
//
// Only literal values are changed: on the node itself, or on the primitive node (`PrimitiveInt`,
// `PrimitiveFloat`) a link brings the value from. A size or frame count that a `ComfyMathExpression` of one
// linked variable computes from a primitive (`max(4, a // 16 * 16)`, `a * 16 + 1`) shrinks through that
// primitive: to 64 for a size, to 1 for a frame count (the smallest value such a formula surely takes
// positive). Everything else (seeds, prompts, samplers, strengths) is sent as the frontend converted it.

const primitives = new Set(['PrimitiveInt', 'PrimitiveFloat']);

const SIZE = 64;
const STEPS = 2;
const TOKENS = 8;
const MEGAPIXELS = (SIZE * SIZE) / 1e6;

/** The input's minimum in `/object_info`, when it declares one. */
function minimum(objectInfo, classType, input) {
  const spec = objectInfo[classType]?.input;
  const entry = spec?.required?.[input] ?? spec?.optional?.[input];
  const min = entry?.[1]?.min;
  return typeof min === 'number' ? min : undefined;
}

/**
 * Shrinks `prompt` (an API prompt, changed in place) as the module comment says; returns what changed, as
 * `node.input old→new` strings.
 */
export function shrink(prompt, objectInfo) {
  // Values are read as converted (a primitive may feed several nodes) and written to `prompt`.
  const original = structuredClone(prompt);
  const changes = [];
  const set = (id, input, value) => {
    const node = prompt[id];
    const old = node.inputs[input];
    if (old === value) return;
    node.inputs[input] = value;
    changes.push(`${id}.${input} ${old}→${value}`);
  };
  /** Where the value of `id.input` is set: the node itself, or the primitive a link brings it from. */
  const source = (id, input) => {
    const value = original[id].inputs[input];
    if (typeof value === 'number') return [id, input];
    if (Array.isArray(value) && primitives.has(original[value[0]]?.class_type)) {
      const from = String(value[0]);
      if (typeof original[from].inputs.value === 'number') return [from, 'value'];
    }
    return null;
  };
  /** The places `id.input`'s value may come from through a `ComfySwitchNode`: each branch's literal source. */
  const switched = (id, input) => {
    const value = original[id].inputs[input];
    if (!Array.isArray(value) || original[value[0]]?.class_type !== 'ComfySwitchNode') return [];
    const from = String(value[0]);
    return ['on_false', 'on_true'].flatMap((branch) => {
      const at = source(from, branch);
      return at ? [at] : switched(from, branch);
    });
  };
  /** The primitive a value comes from through a math expression of one linked variable. */
  const throughExpression = (id, input) => {
    const value = original[id].inputs[input];
    if (!Array.isArray(value) || original[value[0]]?.class_type !== 'ComfyMathExpression') return null;
    const expression = String(value[0]);
    const linked = Object.entries(original[expression].inputs)
      .filter(([name, v]) => name.startsWith('values.') && Array.isArray(v));
    return linked.length === 1 ? source(expression, linked[0][0]) : null;
  };
  const literal = (id, input) => {
    const at = source(id, input);
    return at ? [at, original[at[0]].inputs[at[1]]] : [null, undefined];
  };
  for (const [id, node] of Object.entries(original)) {
    const min = (input, otherwise) => Math.max(minimum(objectInfo, node.class_type, input) ?? otherwise, otherwise);
    for (const input of ['width', 'height']) {
      const [at, value] = literal(id, input);
      if (at && value > SIZE) set(...at, min(input, SIZE));
      const via = at ? null : throughExpression(id, input);
      if (via && original[via[0]].inputs[via[1]] > SIZE) set(...via, SIZE);
    }
    for (const input of ['length', 'frames', 'num_frames', 'video_frames', 'motion_frame_count']) {
      const [at] = literal(id, input);
      if (at) set(...at, minimum(objectInfo, node.class_type, input) ?? 1);
      const via = at ? null : throughExpression(id, input);
      if (via && original[via[0]].inputs[via[1]] > 1) set(...via, 1);
    }
    const [pixelsAt, pixels] = literal(id, 'megapixels');
    if (pixelsAt && pixels > MEGAPIXELS) set(...pixelsAt, min('megapixels', MEGAPIXELS));
    const [splitAt, split] = literal(id, 'step');
    if (node.class_type === 'SplitSigmas' && splitAt && split > 1) set(...splitAt, 1);
    const [batchAt, batch] = literal(id, 'batch_size');
    if (batchAt && batch > 1) set(...batchAt, 1);
    const [tokensAt, tokens] = literal(id, 'max_length');
    if (node.class_type === 'TextGenerate' && tokensAt && tokens > TOKENS) set(...tokensAt, TOKENS);
    const [stepsAt, steps] = literal(id, 'steps');
    if (stepsAt && steps > STEPS) {
      for (const input of ['start_at_step', 'end_at_step']) {
        const [at, value] = literal(id, input);
        if (at && value > 0 && value < steps) set(...at, Math.max(1, Math.round((value * STEPS) / steps)));
      }
      set(...stepsAt, STEPS);
    }
    for (const at of stepsAt ? [] : switched(id, 'steps')) {
      if (original[at[0]].inputs[at[1]] > STEPS) set(...at, STEPS);
    }
  }
  return changes;
}
