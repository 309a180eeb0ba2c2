"""A built-in catalogue of common rental GPUs: memory, dense rates, memory bandwidth, compute capability.

Figures are the vendors' datasheet numbers (source on each entry). Tensor rates are DENSE: NVIDIA's
headline tensor numbers assume 2:4 structured sparsity, which training does not use, so those are
halved here. ``fp32_tflops`` is the plain (non-tensor) FP32 rate: torch leaves TF32 off for matmuls
by default (``torch.backends.cuda.matmul.allow_tf32 = False``), so an fp32 campaign runs at it.

Memory is the datasheet size read as GiB. What a process can use is a little less (the driver and
ECC keep some: an "80GB" H100 shows about 79.6 GiB in nvidia-smi); the sheet's stated margin covers it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pilotrun.errors import BadInput

GiB = 2**30


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    memory_gib: float
    bf16_tflops: float | None  # dense tensor-core BF16 (FP32 accumulate); None: no bf16 tensor cores
    fp16_tflops: float  # dense tensor-core FP16 (FP32 accumulate)
    fp32_tflops: float  # non-tensor FP32
    bandwidth_gbs: float  # memory bandwidth, GB/s
    compute_capability: str
    match: tuple[str, ...]  # lower-case words that all appear in torch.cuda.get_device_name()
    source: str
    sky: str = ""  # SkyPilot's accelerator name (`sky show-gpus`)
    vendor: str = "nvidia"  # nvidia (CUDA) | amd (ROCm: torch.cuda over HIP, RCCL for NCCL)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)

    @property
    def bf16(self) -> bool:
        return self.vendor == "amd" or float(self.compute_capability) >= 8.0

    @property
    def slurm_gres(self) -> str:
        """The GRES type name sites commonly give this GPU (site-specific: `sinfo -o %G` shows the real one)."""
        return self.key.split("-")[0]

    def rate_tflops(self, precision: str) -> float:
        """The dense rate a campaign of this precision runs its matmuls at."""
        if precision in ("bf16-mixed", "bf16-true"):
            return self.bf16_tflops or 0.0
        if precision == "fp16-mixed":
            return self.fp16_tflops
        return self.fp32_tflops

    def rate_label(self, precision: str) -> str:
        if precision in ("bf16-mixed", "bf16-true", "fp16-mixed"):
            return f"{precision.split('-')[0]} tensor-core dense rate"
        return "fp32 non-tensor rate, TF32 off as torch defaults"

    def to_json(self) -> dict:
        d = asdict(self)
        d["memory_bytes"] = self.memory_bytes
        d["bf16"] = self.bf16
        return d


CATALOGUE: tuple[GPU, ...] = (
    # NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TFLOPS FP16 mixed precision (dense), 8.1 TFLOPS FP32.
    # Turing: no bf16 tensor cores.
    GPU("t4", "T4 16GB", 16, None, 65.0, 8.1, 320, "7.5", ("t4",), "NVIDIA T4 Tensor Core GPU datasheet", sky="T4"),
    # NVIDIA Ada Lovelace architecture whitepaper, appendix table for RTX 4090: BF16/FP16 tensor with FP32
    # accumulate 165.2 dense (330.4 sparse), FP32 82.6, 1008 GB/s GDDR6X.
    GPU("rtx4090", "RTX 4090 24GB", 24, 165.2, 165.2, 82.6, 1008, "8.9", ("4090",),
        "NVIDIA Ada Lovelace GPU architecture whitepaper, Table 'GeForce RTX 4090'", sky="RTX4090"),
    # NVIDIA L4 datasheet: BF16/FP16 tensor 242 TFLOPS with sparsity (121 dense), FP32 30.3, 300 GB/s.
    GPU("l4", "L4 24GB", 24, 121.0, 121.0, 30.3, 300, "8.9", ("l4",), "NVIDIA L4 Tensor Core GPU datasheet", sky="L4"),
    # NVIDIA A10 datasheet: BF16/FP16 tensor 125 dense (250 sparse), FP32 31.2, 600 GB/s GDDR6.
    GPU("a10", "A10 24GB", 24, 125.0, 125.0, 31.2, 600, "8.6", ("a10",), "NVIDIA A10 Tensor Core GPU datasheet", sky="A10"),
    # NVIDIA L40S datasheet: BF16/FP16 tensor 362.05 dense (733 sparse), FP32 91.6, 864 GB/s GDDR6.
    GPU("l40s", "L40S 48GB", 48, 362.05, 362.05, 91.6, 864, "8.9", ("l40s",), "NVIDIA L40S GPU datasheet", sky="L40S"),
    # NVIDIA L40 datasheet: 48 GB GDDR6, 864 GB/s, FP32 90.5, BF16/FP16 tensor 181.05 dense (362.1 sparse).
    GPU("l40", "L40 48GB", 48, 181.05, 181.05, 90.5, 864, "8.9", ("l40",), "NVIDIA L40 GPU datasheet", sky="L40"),
    # NVIDIA A40 datasheet: 48 GB GDDR6, 696 GB/s, FP32 37.4, BF16/FP16 tensor 149.7 dense (299.4 sparse).
    GPU("a40", "A40 48GB", 48, 149.7, 149.7, 37.4, 696, "8.6", ("a40",), "NVIDIA A40 datasheet", sky="A40"),
    # NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, FP32 38.7, tensor 309.7 sparse (154.85 dense).
    GPU("rtxa6000", "RTX A6000 48GB", 48, 154.85, 154.85, 38.7, 768, "8.6", ("rtx", "a6000"),
        "NVIDIA RTX A6000 datasheet", sky="RTXA6000"),
    # NVIDIA A100 datasheet (SXM): BF16/FP16 tensor 312 dense (624 sparse), FP32 19.5;
    # 40GB HBM2 1555 GB/s, 80GB HBM2e 2039 GB/s.
    GPU("a100-40gb", "A100 40GB SXM", 40, 312.0, 312.0, 19.5, 1555, "8.0", ("a100", "40gb"),
        "NVIDIA A100 Tensor Core GPU datasheet", sky="A100"),
    GPU("a100-80gb", "A100 80GB SXM", 80, 312.0, 312.0, 19.5, 2039, "8.0", ("a100",),
        "NVIDIA A100 Tensor Core GPU datasheet", sky="A100-80GB"),
    # NVIDIA H100 datasheet: PCIe BF16/FP16 1513 sparse (756.5 dense), FP32 51, 2.0 TB/s;
    # SXM BF16/FP16 1979 sparse (989.5 dense), FP32 67, 3.35 TB/s.
    GPU("h100-pcie", "H100 80GB PCIe", 80, 756.5, 756.5, 51.0, 2000, "9.0", ("h100", "pcie"),
        "NVIDIA H100 Tensor Core GPU datasheet", sky="H100"),
    GPU("h100-sxm", "H100 80GB SXM", 80, 989.5, 989.5, 67.0, 3350, "9.0", ("h100",),
        "NVIDIA H100 Tensor Core GPU datasheet", sky="H100"),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, BF16/FP16 1979 sparse (989.5 dense), FP32 67.
    GPU("h200", "H200 141GB SXM", 141, 989.5, 989.5, 67.0, 4800, "9.0", ("h200",),
        "NVIDIA H200 Tensor Core GPU datasheet", sky="H200"),
    # NVIDIA HGX B200 datasheet, per GPU (the 8-GPU board's figures / 8): 180 GB HBM3e, 8 TB/s,
    # FP16/BF16 tensor 4.5 PFLOPS sparse (2250 dense), FP32 75 TFLOPS.
    GPU("b200", "B200 180GB SXM", 180, 2250.0, 2250.0, 75.0, 8000, "10.0", ("b200",),
        "NVIDIA HGX B200 datasheet (per GPU)", sky="B200"),
    # AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, BF16/FP16 matrix 1307.4 dense (2614.9 sparse),
    # FP32 vector 81.7. ROCm, not CUDA: compute_capability holds the gfx target.
    GPU("mi300x", "MI300X 192GB", 192, 1307.4, 1307.4, 81.7, 5300, "gfx942", ("mi300x",),
        "AMD Instinct MI300X accelerator datasheet", sky="MI300X", vendor="amd"),
)

BY_KEY = {g.key: g for g in CATALOGUE}


def get_gpu(key: str) -> GPU:
    gpu = BY_KEY.get(key.lower())
    if gpu is None:
        near = _near(key)
        raise BadInput(f"no GPU {key!r} in the built-in catalogue", where="--gpu",
                       fix=(f"did you mean {' or '.join(near)}? " if near else "")
                       + f"choose one of: {', '.join(BY_KEY)}")
    return gpu


def _near(given: str) -> list[str]:
    """The catalogue keys a --gpu that is none of them names: a key's beginning in other case or spacing ("H100" →
    h100-pcie, h100-sxm), else a device name as torch or nvidia-smi says it ("NVIDIA H100 80GB HBM3" → h100-sxm)."""
    flat = "".join(c for c in given.lower() if c.isalnum())
    begun = [k for k in BY_KEY if flat and "".join(c for c in k if c.isalnum()).startswith(flat)]
    matched = match_gpu(given)
    return begun or ([matched.key] if matched is not None else [])


def match_gpu(device_name: str | None, memory_bytes: int | None = None) -> GPU | None:
    """The catalogue entry for a device name as torch reports it ("NVIDIA H100 80GB HBM3"), or None.

    Entries are tried in catalogue order with the more specific one of a pair first where it matters
    (A100 40GB before A100, H100 PCIe before H100); a memory size, when given, must agree within 15%.
    """
    if not device_name:
        return None
    name = device_name.lower().replace("-", " ")
    words = set(name.split())
    for gpu in sorted(CATALOGUE, key=lambda g: -len(g.match)):
        if all((m in words) or (len(m) > 3 and m in name) for m in gpu.match):
            if memory_bytes and abs(memory_bytes - gpu.memory_bytes) > 0.15 * gpu.memory_bytes:
                continue
            return gpu
    return None
