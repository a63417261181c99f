// WebCrypto as the add-on finds it in Firefox: the global `crypto`. Node 18
// (Debian 12's nodejs) has it only as node:crypto's webcrypto; Node 19 and
// later have the global already. Imported first by every test file.
import { webcrypto } from "node:crypto";

if (globalThis.crypto === undefined) globalThis.crypto = webcrypto;
