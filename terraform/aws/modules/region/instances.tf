data "aws_ami" "ubuntu" {
  most_recent = true
  owners      = ["099720109477"] # Canonical

  filter {
    name   = "name"
    values = [var.ami_name_filter]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
}

resource "aws_instance" "geolog" {
  count                  = length(var.geolog_nodes)
  ami                    = data.aws_ami.ubuntu.id
  instance_type          = var.geolog_instance_type
  subnet_id              = aws_subnet.zone[var.geolog_nodes[count.index].az_index].id
  private_ip             = var.geolog_nodes[count.index].ip
  vpc_security_group_ids = [aws_security_group.geolog.id]
  key_name               = var.ssh_key_name
  user_data_base64       = base64gzip(var.geolog_nodes[count.index].user_data)

  metadata_options {
    http_tokens = "required"
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = var.geolog_volume_gb
    throughput  = var.geolog_volume_throughput_mibps
    iops        = var.geolog_volume_iops
    encrypted   = true
  }

  tags = {
    Name = "${var.name}-${var.geolog_nodes[count.index].name}"
    Role = "geologd"
  }

  lifecycle {
    # A newer AMI must not replace running nodes: roll them one at a time
    # (terraform apply -replace) instead.
    ignore_changes = [ami]
  }
}

resource "aws_instance" "cockroach" {
  count                  = length(var.cockroach_nodes)
  ami                    = data.aws_ami.ubuntu.id
  instance_type          = var.cockroach_instance_type
  subnet_id              = aws_subnet.zone[var.cockroach_nodes[count.index].az_index].id
  private_ip             = var.cockroach_nodes[count.index].ip
  vpc_security_group_ids = [aws_security_group.cockroach.id]
  key_name               = var.ssh_key_name
  user_data_base64       = base64gzip(var.cockroach_nodes[count.index].user_data)

  metadata_options {
    http_tokens = "required"
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = var.cockroach_volume_gb
    encrypted   = true
  }

  tags = {
    Name = "${var.name}-${var.cockroach_nodes[count.index].name}"
    Role = "cockroach"
  }

  lifecycle {
    ignore_changes = [ami]
  }
}
