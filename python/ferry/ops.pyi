# Type stubs for ferry.ops (implemented in C by ferry._ferry._ops). The runtime docstrings are the contract; these
# stubs repeat the signatures, and the ownership rules in short, for type checkers and editors.

from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any, Literal, NamedTuple, Protocol, final

class _CudaStreamLike(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...

# A stream: None (the operands' framework's current stream, asked at every call through the DLPack exchange API;
# the legacy default stream when no operand came through one), an int CUstream, torch.cuda.Stream (.cuda_stream),
# a CuPy stream (.ptr), or an object with __cuda_stream__.
_Stream = int | _CudaStreamLike | Any | None
# A tensor: torch (read through its DLPack exchange API), or any object with __dlpack__ / __dlpack_device__.
_Tensor = Any
# A target: 90, "90", "sm_90", "sm_90a", "9.0".
_Target = int | str

@final
class Status:
    """A support check's answer: true when supported; false with .error, the reason."""

    @property
    def error(self) -> str | None: ...
    def __bool__(self) -> bool: ...

class Design(NamedTuple):
    instruction: str
    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    threads: int
    smem_bytes: int

class Constraints(NamedTuple):
    a_types: tuple[str, ...]
    b_types: tuple[str, ...]
    out_types: tuple[str, ...]
    accumulator_types: tuple[str, ...]
    a_majors: tuple[str, ...]
    b_majors: tuple[str, ...]
    out_majors: tuple[str, ...]
    a_align: int
    b_align: int
    out_align: int
    div_m: int
    div_n: int
    div_k: int
    min_sm: int
    fuses_epilogue: bool

class OperatorMetadata(NamedTuple):
    name: str
    design: Design
    constraints: Constraints
    builtin: bool

class GemmArguments:
    """out = activation(alpha * scale_a * scale_b * A @ B + beta * out + bias), validated once. 8-bit inputs
    (float8_e4m3fn / float8_e5m2, or int8 into int32 or a float type) need A row-major and B column-major.
    scale_a, scale_b: one-element float32 tensors on the device (both or neither), read at every run. bias: a
    contiguous vector of out's
    dtype, (n,) or (1, n) (one value per column, as a linear layer's) or (m, 1) (one per row); activation: None,
    "relu", "gelu_tanh" (torch's approximate="tanh") or "silu" — fused into the kernel, part of its compiled kind.
    Keeps references to A, B, out and bias (and to non-torch operands' DLPack exports) until it dies; captures their
    pointers and layouts at construction. A Launcher made from these arguments keeps their bias and activation.
    alpha and beta are float32 in the kernels (None: the default; a finite value past float32's range is an
    OverflowError). out must not overlap A, B, bias or the scales: the kernels read them while other blocks write out."""

    def __init__(
        self,
        A: _Tensor,
        B: _Tensor,
        out: _Tensor,
        accumulator_type: Any = None,
        *,
        alpha: float | None = 1.0,
        beta: float | None = 0.0,
        bias: _Tensor | None = None,
        activation: Literal["identity", "relu", "gelu_tanh", "silu", "swish"] | None = None,
        scale_a: _Tensor | None = None,
        scale_b: _Tensor | None = None,
    ) -> None: ...
    @property
    def A(self) -> _Tensor: ...
    @property
    def B(self) -> _Tensor: ...
    @property
    def out(self) -> _Tensor: ...
    @property
    def accumulator_type(self) -> Any: ...
    @property
    def bias(self) -> _Tensor | None: ...
    @property
    def activation(self) -> str | None: ...
    @property
    def scale_a(self) -> _Tensor | None: ...
    @property
    def scale_b(self) -> _Tensor | None: ...
    alpha: float
    beta: float
    @property
    def device(self) -> int: ...
    @property
    def problem(self) -> dict[str, int | str | bool]: ...

@final
class CompiledArtifact:
    """A cubin for one target and problem kind. Holds one reference to the C artifact; keep it alive as long as a
    torch CUDA graph that captured a run of it may replay."""

    @property
    def operator(self) -> Operator: ...
    @property
    def target_sm(self) -> int: ...
    @property
    def kind(self) -> int: ...
    @property
    def cubin(self) -> bytes: ...
    def save(self, path: str | PathLike[str]) -> None: ...
    @classmethod
    def load(cls, path: str | PathLike[str]) -> CompiledArtifact: ...

@final
class Launcher:
    """The fast call form. Holds the operator and the artifact, not the tensors."""

    @property
    def operator(self) -> Operator: ...
    @property
    def compiled_artifact(self) -> CompiledArtifact: ...
    @property
    def assume_supported_args(self) -> bool: ...
    def __call__(self, A: _Tensor, B: _Tensor, out: _Tensor, stream: _Stream = None) -> None: ...

@final
class Operator:
    """A registered GEMM operator; one object per operator for the process."""

    @property
    def name(self) -> str: ...
    @property
    def metadata(self) -> OperatorMetadata: ...
    @property
    def design(self) -> Design: ...
    @property
    def constraints(self) -> Constraints: ...
    def supports(self, args: GemmArguments) -> Status: ...
    def compile(self, args: GemmArguments, target_sm: _Target | None = None) -> CompiledArtifact: ...
    def run(
        self,
        args: GemmArguments,
        stream: _Stream = None,
        compiled_artifact: CompiledArtifact | None = None,
        assume_supported_args: bool = False,
    ) -> None: ...
    def launcher(
        self,
        args: GemmArguments,
        compiled_artifact: CompiledArtifact | None = None,
        *,
        assume_supported_args: bool = False,
    ) -> Launcher: ...

@final
class Graph:
    """A CUDA graph of operator runs captured on `stream` until end() / the end of the `with` block. Keeps each
    run's GemmArguments and the stream object alive."""

    def __init__(self, stream: _Stream) -> None: ...
    def __enter__(self) -> Graph: ...
    def __exit__(self, *exc: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def runs(self) -> tuple[GemmArguments, ...]: ...
    @property
    def state(self) -> str: ...
    def run(
        self,
        op: Operator,
        args: GemmArguments,
        compiled_artifact: CompiledArtifact | None = None,
        assume_supported_args: bool = False,
    ) -> int: ...
    def end(self) -> None: ...
    def replay(self, stream: _Stream = None) -> None: ...
    def update(self, index: int, args: GemmArguments, /) -> None: ...
    def close(self) -> None: ...

def get_operators(
    args: GemmArguments,
    target_sm: _Target | None = None,
    metadata_filter: Callable[[OperatorMetadata], bool] | None = None,
) -> list[Operator]: ...
def get_operator(name: str) -> Operator: ...
def operators() -> list[Operator]: ...
def target_sm() -> int: ...
def device_supports(min_sm: _Target) -> Status: ...
def clear_memo() -> None: ...
def cache_stats() -> dict[str, Any]: ...

__all__: Sequence[str]
