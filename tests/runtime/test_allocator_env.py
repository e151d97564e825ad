"""The runtime turns on the CUDA caching allocator's expandable segments unless the user configured the
allocator (runtime.loop.allocator); on CPU nothing changes."""
import os
import subprocess
import sys

import pytest

from partita.runtime.loop.allocator import ENV, SETTING, allocator_env, configure_allocator


def test_cuda_without_a_user_setting_gets_expandable_segments():
    env = {"PATH": "/bin"}
    assert configure_allocator(env, cuda=True) == {ENV: SETTING}
    assert env == {"PATH": "/bin", ENV: "expandable_segments:True"}
    assert configure_allocator(env, cuda=True) == {}  # set once: now it is there


@pytest.mark.parametrize("name", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_a_user_setting_is_left_as_it_is(name):
    env = {name: "max_split_size_mb:512"}
    assert configure_allocator(env, cuda=True) == {} and env == {name: "max_split_size_mb:512"}
    assert allocator_env({name: ""}, cuda=True) == {}  # set, even empty: the user's choice


def test_nothing_is_set_without_cuda():
    env = {}
    assert configure_allocator(env, cuda=False) == {} and env == {}


def test_a_cpu_process_is_left_unchanged():
    """Here (no CUDA) the default arguments read torch.cuda.is_available() and set nothing in os.environ."""
    code = ("import os; os.environ.pop('PYTORCH_CUDA_ALLOC_CONF', None); os.environ.pop('PYTORCH_ALLOC_CONF', None);"
            "from partita.runtime.loop.allocator import configure_allocator; print(configure_allocator(), "
            "'PYTORCH_CUDA_ALLOC_CONF' in os.environ)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["{}", "False"]
