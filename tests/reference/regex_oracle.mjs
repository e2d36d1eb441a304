// regex_oracle.mjs — JavaScript's own RegExp as the oracle of lmserve's regex
// engine (tests/unit/grammar/test-gr-regex.c). Reads [{"p": pattern, "s":
// [strings]}, ...] on stdin; writes, for each, an array of full-match results
// (new RegExp('^(?:' + p + ')$', 'u').test(s)), or null when the pattern does
// not compile.
import { readFileSync } from 'node:fs';

const input = JSON.parse(readFileSync(0, 'utf8'));
const out = input.map(({ p, s }) => {
  let re;
  try {
    re = new RegExp('^(?:' + p + ')$', 'u');
  } catch (e) {
    return null;
  }
  return s.map((x) => re.test(x));
});
process.stdout.write(JSON.stringify(out));
