// The frontend's side of the template suite: in the page of the real ComfyUI frontend that Kiln serves, one
// template is opened as the template browser opens it (its workflow fetched from /templates/, then
// `app.loadGraphData`) and converted to an API prompt by the frontend's own `graphToPrompt`, the truth for widget
// order, converted widgets, subgraphs, bypassed and muted nodes and primitive nodes. The graph is walked as the
// frontend sends it (muted and bypassed nodes, and the insides of muted or bypassed subgraphs, are left out) to
// say which node types the frontend does not know (Kiln's /object_info lacks them) and which files each node
// names.

/**
 * Runs in the page: opens template `name` and converts it. Resolves to `{ prompt, nodes }` (`nodes`: every
 * node the frontend sends, as `{ id, type, known, widgets: [[name, value]], values, models }`), or to
 * `{ error, unknown }` when loading or converting throws (`unknown`: the node types of the workflow, its
 * subgraphs' included, that the frontend does not know, leaving out muted and bypassed nodes; a frontend that
 * lacks a node's type may fail to convert its links).
 */
export async function convertInPage(name) {
  const NEVER = 2;
  const BYPASS = 4;
  const unknownTypes = (workflow) => {
    const subgraphs = workflow.definitions?.subgraphs ?? [];
    const ids = new Set(subgraphs.map((s) => s.id));
    const types = new Set();
    for (const graph of [workflow, ...subgraphs]) {
      for (const node of graph.nodes ?? []) {
        if (node.mode === NEVER || node.mode === BYPASS || ids.has(node.type)) continue;
        if (window.LiteGraph.registered_node_types[node.type] === undefined) types.add(node.type);
      }
    }
    return [...types].sort();
  };
  let workflow = null;
  try {
    const response = await fetch(`/templates/${name}.json`);
    if (!response.ok) return { error: `GET /templates/${name}.json answered ${response.status}` };
    workflow = await response.json();
    await window.app.loadGraphData(workflow, true, true, null);
    const { output } = await window.app.graphToPrompt();
    const nodes = [];
    const walk = (graph, path) => {
      for (const node of graph.nodes) {
        if (node.mode === NEVER || node.mode === BYPASS) continue;
        const id = [...path, node.id].join(':');
        if (node.subgraph) {
          walk(node.subgraph, [...path, node.id]);
          continue;
        }
        const known = window.LiteGraph.registered_node_types[node.type] !== undefined;
        nodes.push({
          id,
          type: node.type,
          known,
          virtual: Boolean(node.isVirtualNode),
          widgets: (node.widgets ?? []).map((w) => [w.name, w.value]),
          values: Array.isArray(node.widgets_values) ? node.widgets_values : [],
          models: node.properties?.models ?? [],
        });
      }
    };
    walk(window.app.graph, []);
    return { prompt: output, nodes };
  } catch (error) {
    const unknown = workflow ? unknownTypes(workflow) : [];
    return { error: `${error?.name ?? 'Error'}: ${error?.message ?? error}`, unknown };
  }
}
