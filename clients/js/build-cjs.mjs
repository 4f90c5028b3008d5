// Writes combd-client.cjs, the CommonJS form of combd-client.js (for require()), from it: the
// same source with its `export`s taken off and the names exported at the end. Run it after a
// change to combd-client.js (`node build-cjs.mjs`); test/client.test.js checks the two agree.
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** The CommonJS form of the module's `source`. */
export function cjs(source) {
  const names = [];
  const body = source.replace(/^export (function|const) (\w+)/gm, (_, kind, name) => {
    names.push(name);
    return `${kind} ${name}`;
  });
  return `// Generated from combd-client.js by build-cjs.mjs: edit that file, not this one.\n"use strict";\n${body}\nmodule.exports = { ${names.join(", ")} };\n`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const dir = new URL(".", import.meta.url);
  const source = readFileSync(new URL("combd-client.js", dir), "utf8");
  writeFileSync(new URL("combd-client.cjs", dir), cjs(source));
}
