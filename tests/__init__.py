# Functional tests (zaza): tests.yaml refers to tests.vgpu_tests.<name>.
