// The template suite's report: the counts, every template's outcome grouped by model family, and the node
// types Kiln lacks ranked by how many templates they hold back, as `target/templates/report.md` for people and
// `report.json` for tools.

/** The headline counts of `results` (one per local template). */
export function counts(results, partnerApi) {
  const ran = results.filter((r) => r.outcome === 'ran').length;
  const covered = results.filter((r) => r.missingNodes.length === 0 && r.outcome !== 'conversion failed').length;
  return { local: results.length, ran, nodeCoverage: covered, partnerApi };
}

/** The one line every run prints and the README quotes. */
export function headline({ local, ran, nodeCoverage, partnerApi }) {
  return (
    `ran ${ran} of ${local} local templates; node coverage ${nodeCoverage} of ${local} ` +
    `(${partnerApi} partner-API templates counted apart)`
  );
}

/**
 * The node types Kiln lacks, most needed first: how many local templates use each (`needed`), of how many it is
 * the only missing one (`unlocks`: adding it alone makes them node-covered), and their families.
 */
export function missingNodes(results) {
  const byType = new Map();
  for (const result of results) {
    for (const type of result.missingNodes) {
      const entry = byType.get(type) ?? { type, needed: 0, unlocks: 0, families: new Set() };
      entry.needed += 1;
      if (result.missingNodes.length === 1) entry.unlocks += 1;
      entry.families.add(result.family);
      byType.set(type, entry);
    }
  }
  return [...byType.values()]
    .map((e) => ({ ...e, families: [...e.families].sort() }))
    .sort((a, b) => b.needed - a.needed || b.unlocks - a.unlocks || a.type.localeCompare(b.type));
}

/** Results grouped by family, the largest family first. */
function byFamily(results) {
  const families = new Map();
  for (const result of results) {
    families.set(result.family, [...(families.get(result.family) ?? []), result]);
  }
  return [...families.entries()].sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]));
}

const cell = (text) => String(text).replaceAll('|', '\\|').replaceAll('\n', ' ');

/** The report as Markdown. */
export function markdown({ packages, results, partnerApi, seconds }) {
  const total = counts(results, partnerApi);
  const kinds = new Map();
  for (const r of results) kinds.set(r.outcome, (kinds.get(r.outcome) ?? 0) + 1);
  const lines = [
    '# Kiln and the official ComfyUI workflow templates',
    '',
    `Templates: ${packages}. Written by \`tests/templates/run.mjs\` (${seconds.toFixed(0)} s); ` +
      'every local template converted by the real frontend, shrunk and run through the real `kiln` binary on ' +
      'tiny synthetic weights.',
    '',
    `**${headline(total)}**`,
    '',
    '| outcome | templates |',
    '|---|---|',
    ...[...kinds.entries()].sort((a, b) => b[1] - a[1]).map(([kind, n]) => `| ${kind} | ${n} |`),
    '',
    '## Missing node types, most needed first',
    '',
    '"needed by": local templates that use it; "unlocks": templates for which it is the only missing node type.',
    '',
    '| node type | needed by | unlocks | families |',
    '|---|---|---|---|',
    ...missingNodes(results).map(
      (m) => `| \`${m.type}\` | ${m.needed} | ${m.unlocks} | ${cell(m.families.join(', '))} |`,
    ),
    '',
    '## By model family',
  ];
  for (const [family, members] of byFamily(results)) {
    const ran = members.filter((r) => r.outcome === 'ran').length;
    lines.push('', `### ${family} (${members.length}; ran ${ran})`, '', '| template | outcome |', '|---|---|');
    for (const r of [...members].sort((a, b) => a.name.localeCompare(b.name))) {
      const detail = r.detail ? `${r.outcome}: ${r.detail}` : r.outcome;
      lines.push(`| \`${r.name}\` | ${cell(detail)} |`);
    }
  }
  return `${lines.join('\n')}\n`;
}

/** The report as JSON. */
export function json({ packages, results, partnerApi, seconds }) {
  return `${JSON.stringify(
    {
      packages,
      seconds,
      counts: counts(results, partnerApi),
      missing_nodes: missingNodes(results),
      templates: results,
    },
    null,
    2,
  )}\n`;
}
