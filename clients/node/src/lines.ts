import type { Readable } from "node:stream";

/**
 * Splits a byte stream into lines ("\n", or "\r\n") of at most `max`
 * bytes, holding no more than `max` bytes of a line at any time: a line
 * that grows past it is dropped as it comes (its bytes are not kept),
 * and `tooLong` is called once for it. Unlike readline, which holds a
 * line however long it grows (a broker that writes an endless line would
 * fill the host's memory, then fail with "Invalid string length").
 */
export class LineSplitter {
  private parts: Buffer[] = [];
  private size = 0;
  private over = false; // the line under way passed max: dropped up to its end

  constructor(
    private readonly max: number,
    private readonly line: (line: Buffer) => void,
    private readonly tooLong: () => void,
  ) {}

  push(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) {
        this.add(chunk.subarray(start));
        return;
      }
      this.add(chunk.subarray(start, nl));
      if (this.over) {
        this.over = false;
      } else {
        this.emit();
      }
      this.parts = [];
      this.size = 0;
      start = nl + 1;
    }
  }

  /** The last line, when the stream ended without a newline. */
  end(): void {
    if (!this.over && this.size > 0) this.emit();
    this.parts = [];
    this.size = 0;
    this.over = false;
  }

  private add(b: Buffer): void {
    if (this.over || b.length === 0) return;
    // The line's own "\r" may go one byte beyond max.
    if (this.size + b.length > this.max + 1) {
      this.over = true;
      this.parts = [];
      this.size = 0;
      this.tooLong();
      return;
    }
    this.parts.push(b);
    this.size += b.length;
  }

  private emit(): void {
    let line = this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts, this.size);
    if (line.length > 0 && line[line.length - 1] === 0x0d) line = line.subarray(0, line.length - 1);
    if (line.length > this.max) {
      this.tooLong();
      return;
    }
    this.line(line);
  }
}

/** The longest line of a broker's stderr that is read; a longer one is dropped. */
export const STDERR_LINE_BYTES = 16 << 10;

/**
 * Calls `line` with each line of a broker's stderr as text; a line over
 * STDERR_LINE_BYTES is not kept, and is told as a note.
 */
export function stderrLines(stream: Readable, line: (s: string) => void): void {
  const split = new LineSplitter(
    STDERR_LINE_BYTES,
    (b) => line(b.toString("utf8")),
    () => line(`(a line over ${STDERR_LINE_BYTES} bytes, dropped)`),
  );
  stream.on("data", (chunk: Buffer) => split.push(chunk));
  stream.on("end", () => split.end());
  stream.on("error", () => {}); // its process's end is handled by its owner
}
