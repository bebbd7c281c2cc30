"""The argument contract that holds with or without CUDA: arguments are checked before anything else, and
messages name the values involved."""

import types

import ferry
import pytest

FUNCTIONS = [ferry.transfer_tensor_d2h, ferry.transfer_tensor_h2d,
             ferry.transfer_tensor_d2h_async, ferry.transfer_tensor_h2d_async]


@pytest.fixture(params=FUNCTIONS, ids=lambda f: f.__name__)
def fn(request):
    return request.param


class FakeTorchDevice:
    """Shaped like torch.device: .type and .index."""

    def __init__(self, type_, index=None):
        self.type, self.index = type_, index

    def __repr__(self):
        return f"device(type={self.type!r}, index={self.index!r})"


@pytest.mark.parametrize("device", ["cpu", "mps", "cuda:x", "cuda:-1", "cuda0", FakeTorchDevice("cpu")])
def test_non_cuda_device_raises_value_error_naming_it(fn, device):
    with pytest.raises(ValueError) as e:
        fn([1], device=device)
    assert repr(device) in str(e.value) or str(device) in str(e.value)


def test_negative_device_index_raises_value_error(fn):
    with pytest.raises(ValueError, match="-1"):
        fn([1], device=-1)


@pytest.mark.parametrize("device", [1.5, True, object()])
def test_device_of_wrong_type_raises_type_error(fn, device):
    with pytest.raises(TypeError, match="device"):
        fn([1], device=device)


def test_stream_without_device_raises_value_error(fn):
    with pytest.raises(ValueError, match="without device"):
        fn([1], stream=1234)


@pytest.mark.parametrize("stream", ["s", 1.0, object()])
def test_stream_of_wrong_type_raises_type_error(fn, stream):
    with pytest.raises(TypeError, match="stream"):
        fn([1], device=0, stream=stream)


def test_negative_stream_handle_raises_value_error(fn):
    with pytest.raises(ValueError, match="-5"):
        fn([1], device=0, stream=-5)


def test_producer_event_of_wrong_type_raises_type_error(fn):
    with pytest.raises(TypeError, match="producer_event"):
        fn([1], producer_event="e")


def test_unrecorded_event_raises_value_error(fn):
    event = types.SimpleNamespace(cuda_event=0)  # a torch.cuda.Event before its first record()
    with pytest.raises(ValueError, match="no CUDA event"):
        fn([1], producer_event=event)
    with pytest.raises(ValueError, match="no CUDA event"):
        fn([1], producer_event=0)


def test_positional_and_keyword_errors_name_the_function(fn):
    with pytest.raises(TypeError, match=fn.__name__):
        fn()
    with pytest.raises(TypeError, match=fn.__name__):
        fn([1], [2])
    with pytest.raises(TypeError, match="'devcie'"):
        fn([1], devcie=0)


@pytest.mark.parametrize("device", [None, 0, 3, "cuda", "cuda:0", "cuda:7", FakeTorchDevice("cuda", 0),
                                    FakeTorchDevice("cuda")])
def test_valid_device_spellings_are_accepted(device, no_cuda):
    batch = [1]
    assert ferry.transfer_tensor_d2h(batch, device=device) is batch


def test_stream_spellings_are_accepted(no_cuda):
    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 1234)

    batch = [1]
    for stream in (1234, 0, types.SimpleNamespace(cuda_stream=1234, device_index=0),
                   types.SimpleNamespace(ptr=1234, device_id=0), CudaStreamProtocol()):
        assert ferry.transfer_tensor_d2h(batch, device=0, stream=stream) is batch


def test_event_spellings_are_accepted(no_cuda):
    batch = [1]
    for event in (99, types.SimpleNamespace(cuda_event=99), types.SimpleNamespace(ptr=99)):
        assert ferry.transfer_tensor_h2d(batch, producer_event=event) is batch
