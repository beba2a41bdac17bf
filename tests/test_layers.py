"""The package's layers: every import points down (or across a layer), and none makes a cycle;
and the package's own imports inside functions are few, each with its reason.

Read from the source with ``ast`` (nothing is imported), imports inside functions included:
base -> config -> models, data, checkpoints -> training -> evals -> drivers -> tools, and
the benchmarks above them all (docs/architecture.md).
"""

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The layers, bottom first; a module's layer is that of its longest listed prefix (the
# package itself, 'vit_jax', is named exactly: its __init__ picks jax's platforms).
LAYERS = (
    ('vit_jax', 'vit_jax.base'),
    ('vit_jax.config',),
    ('vit_jax.models', 'vit_jax.data', 'vit_jax.checkpoints'),
    ('vit_jax.training',),
    ('vit_jax.evals',),
    ('vit_jax.main', 'vit_jax.evaluate', 'vit_jax.evaluation', 'vit_jax.fewshot', 'vit_jax.sweep',
     'vit_jax.vtab'),
    ('vit_jax.tools',),
    ('benchmarks',),
)


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def modules() -> dict[str, pathlib.Path]:
  files = [*(ROOT / 'vit_jax').rglob('*.py'), *(ROOT / 'benchmarks').rglob('*.py')]
  return {module_name(p): p for p in files}


def layer(module: str) -> int:
  prefixes = [(len(p), i) for i, names in enumerate(LAYERS) for p in names
              if module == p or (p != 'vit_jax' and module.startswith(p + '.'))]
  assert prefixes, f'{module} is in no layer: add it to LAYERS (and docs/architecture.md).'
  return max(prefixes)[1]


@functools.cache
def parse(path: pathlib.Path) -> ast.Module:
  return ast.parse(path.read_text())


def imports(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
  """The project modules ``path`` imports, at any depth of the file."""
  found = set()
  for node in ast.walk(parse(path)):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:  # `from pkg import module` names the module, else the package.
        full = f'{node.module}.{a.name}'
        found.add(full if full in known else node.module)
  return {m for m in found if m in known}


GRAPH = {name: imports(path, modules()) for name, path in modules().items()}


@pytest.mark.parametrize('name', sorted(GRAPH))
def test_no_upward_import(name):
  upward = sorted(m for m in GRAPH[name] if layer(m) > layer(name))
  assert not upward, f'{name} (layer {layer(name)}) imports from layers above it: {upward}'


def test_no_cycle():
  done, stack = set(), []

  def visit(name):
    if name in stack:
      raise AssertionError('import cycle: ' + ' -> '.join(stack[stack.index(name):] + [name]))
    if name in done:
      return
    stack.append(name)
    for child in sorted(GRAPH[name]):
      visit(child)
    stack.pop()
    done.add(name)

  for name in sorted(GRAPH):
    visit(name)


def test_top_level_modules_few():
  top = sorted(p.stem for p in (ROOT / 'vit_jax').glob('*.py') if p.stem != '__init__')
  assert len(top) <= 10, top


# A command's seam: it checks its command line with modules that need no jax, then imports the
# module that does the work (docs/architecture.md, "A command"). Few such imports, each saying
# why on its line.
MAX_DEFERRED = 20


def deferred_imports() -> list[tuple[str, bool]]:
  """('path:line', whether its lines hold a comment) of each import of a vit_jax module
  inside a function of the package."""
  found = {}

  def visit(node: ast.AST, path: pathlib.Path, lines: list[str], in_function: bool) -> None:
    for child in ast.iter_child_nodes(node):
      own = (isinstance(child, ast.ImportFrom) and (child.level or (child.module or '').startswith(
          'vit_jax'))) or (isinstance(child, ast.Import) and any(
              a.name.startswith('vit_jax') for a in child.names))
      if own and in_function:
        found[f'{path.relative_to(ROOT)}:{child.lineno}'] = any(
            '#' in line for line in lines[child.lineno - 1:child.end_lineno])
      visit(child, path, lines, in_function or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef)))

  for path in sorted((ROOT / 'vit_jax').rglob('*.py')):
    visit(parse(path), path, path.read_text().splitlines(), False)
  return sorted(found.items())


def test_deferred_imports_are_few_and_say_why():
  found = deferred_imports()
  assert len(found) <= MAX_DEFERRED, (
      f'{len(found)} imports of vit_jax modules inside functions (at most {MAX_DEFERRED}): '
      'import at the top, or through the command\'s one seam: ' + ', '.join(w for w, _ in found))
  unexplained = [where for where, commented in found if not commented]
  assert not unexplained, f'say why on the line (a comment) of: {", ".join(unexplained)}'
