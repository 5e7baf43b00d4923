// This module's own file, in the ESM build and the CommonJS one alike: a
// CommonJS module (.cts, built to .cjs) has __filename in both, where an
// ES module would need import.meta, which CommonJS cannot parse. Packages
// are resolved from here, as they are from the rest of this package.
export const selfFile: string = __filename;
