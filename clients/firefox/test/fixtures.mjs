// The answers the Python notary signed (make_fixtures.py): the committed
// file, or a fresh one named by NOTARY_FIXTURES.
import { readFileSync } from "node:fs";

const path = process.env.NOTARY_FIXTURES || new URL("./fixtures/answers.json", import.meta.url);
export const fixtures = JSON.parse(readFileSync(path, "utf-8"));
