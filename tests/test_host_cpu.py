"""Tests of vit_jax.base.cpu.host_cpu: the CPU's instruction sets, and the bfloat16 warning."""

from vit_jax.base.cpu import host_cpu

# /proc/cpuinfo's first processor, abridged: the development machine's AVX2 CPU (AMD Zen 3),
# the same with AVX-512 and bfloat16 instructions added, and an Arm server.
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse2 ssse3 fma avx avx2 bmi2 sha_ni

processor\t: 1
model name\t: another
"""
AVX512 = ZEN3.replace('model\t\t: 1\n', 'model\t\t: 17\n').replace(
    'sha_ni', 'avx512f avx512bw avx512_bf16 sha_ni')
ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd aes sve bf16
CPU implementer\t: 0x41
"""


def test_cpu_info_reads_the_isa_that_matmul_speed_depends_on():
  zen3 = host_cpu.cpu_info(ZEN3)
  assert zen3 == {'model_name': 'AMD EPYC', 'family': '25', 'model': '1',
                  'cores': zen3['cores'], 'isa': ['avx2', 'fma'], 'native_bf16': False}
  assert host_cpu.describe(zen3).startswith('AMD EPYC (family 25, model 1), ')
  assert host_cpu.describe(zen3).endswith(
      'avx2 fma; no bfloat16 instructions: bfloat16 products are emulated')
  avx512 = host_cpu.cpu_info(AVX512)
  assert avx512['model'] == '17' and avx512['native_bf16']
  assert avx512['isa'] == ['avx2', 'fma', 'avx512f', 'avx512_bf16']
  assert host_cpu.describe(avx512).endswith('; bfloat16 dot products native')
  arm = host_cpu.cpu_info(ARM)
  assert arm['isa'] == ['asimd', 'sve', 'bf16'] and arm['native_bf16']
  assert arm['family'] is None and arm['model_name']  # platform's name stands in.
  assert host_cpu.cpu_info('')['isa'] == []


def test_emulated_bfloat16_products_are_warned_about_on_cpus_without_them():
  zen3, avx512 = host_cpu.cpu_info(ZEN3), host_cpu.cpu_info(AVX512)
  warning = host_cpu.emulated_bf16_warning('cpu', 'bfloat16', zen3)
  assert warning.startswith('model.matmul_dtype=bfloat16, but this CPU has no bfloat16 '
                            'instructions (AMD EPYC: avx2 fma)')
  assert 'Leave model.matmul_dtype unset' in warning
  assert host_cpu.emulated_bf16_warning('cpu', 'bfloat16', avx512) is None
  assert host_cpu.emulated_bf16_warning('cpu', None, zen3) is None
  assert host_cpu.emulated_bf16_warning('gpu', 'bfloat16', zen3) is None
